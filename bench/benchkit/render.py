"""Printing tables: the header, a rule of dashes, then one row per metric, columns aligned."""

from .common import NOISE_PCT


def format_table(rows, left=1):
    """Rows of cells (the first is the header) as aligned text: the first `left` columns padded on
    the right, the others on the left, two spaces apart, a rule of dashes under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j < left else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def metric_cell(v, fmt, scale):
    return "-" if v is None else fmt.format(v * scale)


def columns_table(header, rows_spec, agg, cols, ratio=None):
    """A table with one column per entry of `cols` (keys of `agg`), plus an optional ratio column:
    ratio = (label, numerator col, denominator col, keys it applies to). rows_spec holds
    (label, metric key, format, scale) per row."""
    rows = [header]
    for label, key, fmt, scale in rows_spec:
        vals = [agg.get(c, {}).get(key) for c in cols]
        row = [label] + [metric_cell(v, fmt, scale) for v in vals]
        if ratio:
            _, num, den, keys = ratio
            a, b = agg.get(num, {}).get(key), agg.get(den, {}).get(key)
            row.append(f"{a / b:.2f}" if key in keys and a is not None and b else "-")
        rows.append(row)
    return format_table(rows)


def print_columns(header, rows_spec, agg, cols, ratio=None):
    print(columns_table(header, rows_spec, agg, cols, ratio), flush=True)


def metric_header(runs):
    """The first column's heading: "metric", and over several runs what the numbers are."""
    return "metric" + (f" (median of {runs})" if runs > 1 else "")


def noise_warning(noisy, quiet_clause=True):
    """The warning printed when processes outside the benchmark used more than NOISE_PCT% of a
    core in a measured phase (None when they did not)."""
    if noisy <= NOISE_PCT:
        return None
    clause = "treat these numbers as noisy."
    if quiet_clause:
        clause = "the machine was not quiet, " + clause
    return (f"\nWARNING: processes outside the benchmark used up to {noisy:.0f}% of a core during a "
            f"measured phase: {clause}")


def print_noise_warning(aggs, key="other_cpu_pct", quiet_clause=True):
    """Prints noise_warning for the worst `key` over the aggregates `aggs`."""
    noisy = max((a.get(key, 0) for a in aggs), default=0)
    warning = noise_warning(noisy, quiet_clause)
    if warning:
        print(warning, flush=True)


def print_appended(path, n):
    """The closing line of a run that wrote `n` lines to the results file `path` ('' : none)."""
    if path:
        print(f"\nappended {n} line(s) to {path}", flush=True)
