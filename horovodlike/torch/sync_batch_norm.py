"""SyncBatchNorm: batch normalization whose statistics cover the whole global batch.

Forward (training): each rank computes its per-channel mean, biased variance and
element count; one allgather brings every rank's triple to every rank, and they are
combined exactly (a pooled mean and variance, so ranks may have different batch sizes).
Backward: the per-channel sums of dy and dy * x_hat are allreduced (Sum), which is what
the input gradient of a normalization over the global batch needs; the weight and bias
gradients stay local (DistributedOptimizer averages them like any other gradient).

Evaluation mode, or a single rank, is plain batch normalization.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from . import _collectives as C
from ._process_sets import global_process_set, resolve


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _channel_view(v, x):
    return v.view([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        dtype = x.dtype
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        xc = x.contiguous().to(compute)
        channels = xc.shape[1]
        dims = _reduce_dims(xc)
        count = xc.numel() // channels if channels else 0
        if count:
            mean = xc.mean(dims)
            var = xc.var(dims, unbiased=False)
        else:
            mean = xc.new_zeros(channels)
            var = xc.new_zeros(channels)
        mine = torch.cat([mean.to(torch.float64), var.to(torch.float64),
                          torch.tensor([float(count)], dtype=torch.float64)]).view(1, -1)
        every = C.synchronize(C.allgather_async(mine, process_set=process_set))
        means, variances = every[:, :channels], every[:, channels:2 * channels]
        counts = every[:, 2 * channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got "
                             f"input size {list(x.shape)} on every rank")
        g_mean = (counts * means).sum(0) / total
        g_var = (counts * (variances + (means - g_mean) ** 2)).sum(0) / total
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype),
                                                     alpha=momentum)
                unbiased = g_var * (total / (total - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)
        mean_c = g_mean.to(compute)
        invstd = torch.rsqrt(g_var + eps).to(compute)
        y = (xc - _channel_view(mean_c, xc)) * _channel_view(invstd, xc)
        if weight is not None:
            y = y * _channel_view(weight.to(compute), xc)
        if bias is not None:
            y = y + _channel_view(bias.to(compute), xc)
        ctx.save_for_backward(xc, weight, mean_c, invstd)
        ctx.total, ctx.process_set, ctx.dtype = total, process_set, dtype
        ctx.has_bias = bias is not None
        return y.to(dtype)

    @staticmethod
    def backward(ctx, grad_output):
        xc, weight, mean, invstd = ctx.saved_tensors
        dy = grad_output.contiguous().to(xc.dtype)
        dims = _reduce_dims(xc)
        xhat = (xc - _channel_view(mean, xc)) * _channel_view(invstd, xc)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat])
            both = C.synchronize(C.allreduce_async(both, op=C.Sum, process_set=ctx.process_set))
            channels = sum_dy.numel()
            g_sum_dy, g_sum_dy_xhat = both[:channels], both[channels:]
            scale = invstd if weight is None else invstd * weight.to(xc.dtype)
            grad_input = (dy - _channel_view(g_sum_dy / ctx.total, xc)
                          - xhat * _channel_view(g_sum_dy_xhat / ctx.total, xc))
            grad_input = (grad_input * _channel_view(scale, xc)).to(ctx.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else xc.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of all ranks (in training mode).

    Same arguments as torch.nn.BatchNorm*d, for inputs of any dimension >= 2, plus an
    optional process_set to synchronize over.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        keep_stats = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep_stats else None
        running_var = self.running_var if keep_stats else None
        ps, _ = resolve(self.process_set)
        if not self.training or ps.size() == 1 or not ps.included():
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, self.process_set)
