"""What the rank programs of tests/test_torch_gpu.py share: init() starts the job, sets
R, P and DEV (this rank's GPU: local_rank % device_count, so two ranks share one), and
same()/data() compare a CUDA op's output with the CPU op's."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
import zlib

R = P = DEV = None          # set by init()


def init():
    global R, P, DEV
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    torch.cuda.set_device(thvd.local_rank() % torch.cuda.device_count())
    DEV = torch.device("cuda", torch.cuda.current_device())
    return R, P, DEV


def same(cpu_out, gpu_out, what):
    """The CUDA op's output is on the GPU and equals the CPU op's, bit for bit."""
    if isinstance(cpu_out, (list, tuple)):
        check(len(cpu_out) == len(gpu_out), what, "lengths differ")
        for i, (c, g) in enumerate(zip(cpu_out, gpu_out)):
            same(c, g, f"{what}[{i}]")
        return
    if gpu_out.device.type != "cuda" and not what.endswith("splits"):
        fail(what, f"output on {gpu_out.device}, expected the GPU")
        return
    t_equal(gpu_out.cpu(), cpu_out, what)


def data(dtype, shape, key):
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr((key, R)).encode()))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    return torch.randint(1, 4, shape, generator=g).to(dtype)
