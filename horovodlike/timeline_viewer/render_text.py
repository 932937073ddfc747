"""The text summary: the answer first, then the tables behind it (report.py decides
what they say)."""
from .report import headline, sections, title_line


def table(headers, rows, right=None):
    """Fixed-width table; columns listed in `right` (indices) are right-aligned."""
    right = set(range(1, len(headers))) if right is None else set(right)
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells[1:])
    return out


def render_text(rep, brief=False):
    out = [title_line(rep), ""] + headline(rep)
    for sec in ([] if brief else sections(rep)):
        out += ["", sec.title]
        if sec.headers:
            out += table(sec.headers, sec.rows, sec.right)
        out += sec.lines
    return "\n".join(out) + "\n"
