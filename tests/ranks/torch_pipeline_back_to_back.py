"""Rank program of tests/test_torch_pipeline.py, run by
test_pipeline_fifty_back_to_back_1f1b_batches."""
from torch_pipeline_common import *  # noqa: F401,F403 (init, the shared helpers, torch, thvd, hvd, np)


def main():
    R, N = init()
    topo = Topology(pp=2)
    torch.manual_seed(4)
    layers = mlp_layers()
    ref = nn.Sequential(*copy.deepcopy(layers))
    pipe = PipelineModule(layers, topology=topo, loss_fn=F.mse_loss)
    sched = Schedule1F1B(pipe, microbatches=4)
    done = 0
    for i in range(50):              # no optimizer step: every batch's loss is known
        x, y = data("mlp", i, 4 + i % 13)      # batch size varies: micro-batch shapes too
        out = sched.train_batch(x, y)
        with torch.no_grad():
            exp = torch.stack([F.mse_loss(ref(a), b) for a, b in
                               zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4))])
        close(torch.stack(out.outputs), exp, f"batch {i} losses")
        done += 1
    check(done == 50, "50 batches")
    finish()


if __name__ == "__main__":
    main()
