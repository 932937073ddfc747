"""Job launcher (``horovodlikerun``) and the rendezvous store it serves."""

from ..common.store import StoreClient, StoreServer
from .run_fn import run

__all__ = ["StoreClient", "StoreServer", "main", "run"]


def main(argv=None):
    # Imported lazily so ranks that only need the store client do not pay
    # for the launcher's imports.
    from .entry import main as _main
    return _main(argv)
