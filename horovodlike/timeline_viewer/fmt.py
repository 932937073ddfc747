"""Number formatting shared by the renderers and the analyses' sentences."""


def fmt_ms(us):
    """Microseconds -> a short human duration ('48.1 ms', '0.25 ms', '3.0 us', '2.31 s')."""
    if us != us:
        return "-"
    ms = us / 1000.0
    if abs(ms) >= 10000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) >= 1000:
        return f"{ms / 1000:.2f} s"
    if abs(ms) >= 100:
        return f"{ms:.0f} ms"
    if abs(ms) >= 1:
        return f"{ms:.1f} ms"
    if abs(ms) >= 0.01:
        return f"{ms:.2f} ms"
    return f"{us:.1f} us"


def fmt_bytes(n):
    if n is None or n < 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} TiB"


def fmt_rate(bytes_, us):
    if us <= 0 or bytes_ < 0:
        return "-"
    return fmt_bytes(bytes_ / (us / 1e6)) + "/s"


def fmt_pct(x):
    if x != x:
        return "-"
    if 0 < abs(x) < 0.001:
        return f"{100 * x:.2g}%"
    return f"{100 * x:.1f}%"
