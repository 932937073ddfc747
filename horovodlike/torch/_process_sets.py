"""Process sets as the torch binding sees them: Horovod's ProcessSet API re-exported from
horovodlike.common, and the two facts a collective needs (request.py's rules)."""
from horovodlike.common.dynamic_sets import (add_process_set,  # noqa: F401
                                             remove_process_set)
from horovodlike.common.process_sets import (ProcessSet, get_process_sets,  # noqa: F401
                                             global_process_set)
from horovodlike.common.request import member_index  # noqa: F401
from horovodlike.common.request import resolve_set as resolve  # noqa: F401
