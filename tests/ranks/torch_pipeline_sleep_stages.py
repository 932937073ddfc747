"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_bubble_from_the_timeline_matches_the_cost_model,
test_timeline_viewer_names_the_stage_that_holds_the_pipeline_up."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)
from horovodlike.common.topology import Topology
from horovodlike.torch.pipeline import PipelineModule, Schedule1F1B, ScheduleGPipe
import torch.nn as nn


def main():
    thvd.init()
    T = float(os.environ["STAGE_SECONDS"])


    class Sleep(torch.autograd.Function):
        """Forward sleeps t, backward 2t: the CPU stays free, so the ranks measure the
        schedule even on fewer cores than ranks."""

        @staticmethod
        def forward(ctx, x, w):
            time.sleep(T)
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            time.sleep(2 * T)
            x, w = ctx.saved_tensors
            return g * w, (g * x).sum().reshape(w.shape)


    class SleepStage(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return Sleep.apply(x, self.w)


    P = thvd.size()
    topo = Topology(pp=P)
    if topo.stage() == int(os.environ.get("SLOW_STAGE", "-1")):
        T *= 2
    pipe = PipelineModule([SleepStage() for _ in range(P)], topology=topo,
                          loss_fn=lambda o, y: ((o - y) ** 2).mean())
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[os.environ["SCHEDULE"]]
    sched = cls(pipe, microbatches=8)
    x, y = torch.ones(16, 4), torch.zeros(16, 4)
    for _ in range(int(os.environ["BATCHES"])):
        sched.train_batch(x, y)
    finish()


if __name__ == "__main__":
    main()
