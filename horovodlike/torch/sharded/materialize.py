"""Filling stage 3's units: from the parameters' values, or, for a model built on the
meta device, by initialising them here (delayed parameter initialisation), one unit at
a time, so that no rank ever holds the model in full.

Every rank initialises every parameter, in the order a full build would, from the same
random state (seed every rank alike, as for any model that is not broadcast), and keeps
its own chunk: the values are bitwise those of a full build under the same seed. The
order: with `init` (a function of a module, as `model.apply(init)` would call it after a
full build) the modules in `apply`'s order, children first; without it, each module's
`reset_parameters()` in the order the modules were built (`model.modules()`). A unit
stays in full until all of its modules have been initialised, then keeps its chunk and
is freed, so one unit is in full at a time when units are whole subtrees (plus a unit
of a module above them, such as the model's own parameters, which waits for its
children under apply's order).

The cost: the initialisation of the whole model on every rank (compute, not memory),
once (twice with `init`).
"""
import torch
import torch.nn as nn


def _apply_order(model):
    out = []

    def visit(m):
        for c in m.children():
            visit(c)
        out.append(m)
    visit(model)
    return out


def fill(model, layout, init=None):
    """Fill every unit of `layout` and keep this member's chunks; for meta parameters,
    replace them in their modules by parameters over the units' buffers. Returns
    {id(meta parameter): its replacement}."""
    units = layout.buckets
    meta = any(e[0].is_meta for b in units for e in b.entries)
    if not meta:
        if init is not None:
            raise ValueError("init= initialises a model built on the meta device; this "
                             "model's parameters already hold values")
        for b in units:
            layout.refill(b)
            with torch.no_grad():
                b.full[b.numel:].zero_()
                for p, j, off, numel in b.entries:
                    b.full[off:off + numel].copy_(p.detach().reshape(-1))
                    p.data = b.full[off:off + numel].view(p.shape)
            layout.keep_own(b)
        return {}
    unit_of = {id(e[0]): b for b in units for e in b.entries}
    holders = {}                                   # id(param) -> [(module, name)]
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((m, name))
    replaced = {}

    def walk(order, action, keep):
        """action(m) for each module holding parameters, in `order`; a unit is filled
        when its first module comes, and kept (or dropped) when its last is done."""
        owners = [m for m in order if any(id(p) in unit_of for p in m.parameters(recurse=False))]
        left = {}
        for m in owners:
            for p in m.parameters(recurse=False):
                if id(p) in unit_of:
                    left.setdefault(unit_of[id(p)].index, set()).add(m)
        for m in owners:
            here = {unit_of[id(p)].index: unit_of[id(p)]
                    for p in m.parameters(recurse=False) if id(p) in unit_of}
            for b in here.values():
                if not b.gathered:
                    _materialize(b, layout, holders, replaced, unit_of,
                                 float("nan") if keep else 0.0)
            action(m)
            for b in here.values():
                left[b.index].discard(m)
                if not left[b.index]:
                    if keep:
                        _check_set(b, replaced)
                        layout.keep_own(b)
                    else:
                        layout.drop(b)

    def reset(m):
        if not hasattr(m, "reset_parameters"):
            raise ValueError(f"delayed initialisation: module {type(m).__name__} holds "
                             f"parameters and has no reset_parameters(); pass init=, a "
                             f"function that initialises a module, as model.apply would")
        m.reset_parameters()

    if init is None:
        walk(list(model.modules()), reset, keep=True)
    else:
        # the build's own initialisation first, for the random state it leaves (its
        # values are dropped: init must set every parameter), then init in apply's order
        walk(list(model.modules()), lambda m: m.reset_parameters()
             if hasattr(m, "reset_parameters") else None, keep=False)
        with torch.no_grad():
            walk(_apply_order(model), init, keep=True)
    for b in units:
        b.entries = [(replaced.get(id(p), p), j, off, numel) for p, j, off, numel in b.entries]
        for p, j, off, numel in b.entries:
            layout.params[j] = p
    return replaced


def _check_set(b, replaced):
    """Every element of the unit's parameters was written (they start as NaN)."""
    for p, j, off, numel in b.entries:
        if torch.isnan(b.full[off:off + numel]).any():
            raise ValueError(f"delayed initialisation: the init function left parameters "
                             f"of unit {b.name!r} unset; it must set every parameter of "
                             f"the modules it is given (or leave init= out to use "
                             f"reset_parameters())")


def _materialize(b, layout, holders, replaced, unit_of, value):
    """b's buffer, filled with `value`, and parameters over it in place of the meta
    ones (tied ones stay one parameter; made once, the buffer refilled in place)."""
    layout.refill(b)
    with torch.no_grad():
        b.full.fill_(value)
    for p, j, off, numel in b.entries:
        if id(p) in replaced:
            continue
        new = nn.Parameter(b.full[off:off + numel].view(p.shape), requires_grad=p.requires_grad)
        replaced[id(p)], unit_of[id(new)] = new, b
        for m, name in holders.get(id(p), []):
            m._parameters[name] = new
