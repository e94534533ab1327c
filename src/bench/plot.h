/*
 * plot.h: `--plot FILE.svg` and `kiln bench plot A.json B.json -o FILE.svg`:
 * decode tok/s and TTFT against input length, one line per result file (an
 * engine, a precision) and row series (no prefix / cached prefix, batch),
 * as a hand-written SVG with a logarithmic input axis.
 */
#ifndef KILN_BENCH_PLOT_H
#define KILN_BENCH_PLOT_H

#include <stddef.h>
#include <stdio.h>

/* texts: JSON results of `kiln bench --format json`; labels: one per text
 * or NULL (then the file's meta: model, precision, backend). Writes the SVG
 * to out; -1 with err when no text has plottable rows. */
int bench_plot_svg(const char *const *texts, const char *const *labels, int n, const char *title, FILE *out, char *err,
                   size_t errlen);

#endif
