"""tools/ktrace.py, the reader of the CUDA kernel timeline (make ktrace,
src/backend/cuda/ktrace.cuh), on a hand-written trace whose answers are
known: launches grouped by grid id in id order, the first/last wait, each
launch's addition to the critical path (an early-started launch that ends
inside the one before adds nothing), kernel names read from the source
line each record names, and the printed table.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ktrace  # noqa: E402

SRC = """// a unit
__global__ void __launch_bounds__(256) k_norm(float *x,
                                              int n) {
    KTRACE();
}

template <int R>
__global__ void k_gemv(float *y) {
    KTRACE();
}
"""

# grid t0 tw t1 unit line sm block (ns); unit 0 is the file above: k_norm's
# KTRACE() on line 4, k_gemv's on line 9
TRACE = """# unit 0 fake/unit.cu
# grid t0 tw t1 unit line sm block mark0..mark3
7 1000 0 3000 0 4 0 0 0 0 0 0
8 1500 3200 9000 0 9 1 0 2700 4500 0 0
8 1600 3300 9500 0 9 2 1 2700 0 0 0
8 1700 3300 8000 0 9 1 2 0 0 0 0
9 2000 8900 9400 0 4 3 0 0 0 0 0
10 9800 0 12000 0 9 0 0 1000 0 0 0
"""


def write(tmp_path):
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "unit.cu").write_text(SRC)
    f = tmp_path / "t.kt"
    f.write_text(TRACE)
    return f


def test_launches_and_critical_path(tmp_path):
    f = write(tmp_path)
    units, recs = ktrace.load(str(f))
    assert units == {0: "fake/unit.cu"}
    assert len(recs) == 6
    ls = ktrace.launches(recs, ktrace.kernel_names(units, str(tmp_path)))
    assert [l["grid"] for l in ls] == [7, 8, 9, 10]
    assert [l["name"] for l in ls] == ["k_norm", "k_gemv", "k_norm", "k_gemv"]
    g = ls[1]
    assert (g["blocks"], g["sms"], g["start"], g["w0"], g["w1"], g["end"]) == (3, 2, 500, 2200, 2300, 8500)
    assert ls[0]["w0"] is None  # no block of it waited
    # adds: 2000; 8500 - 2000; grid 9 ends at 8400, inside grid 8: 0; 11000 - 8500
    assert [l["adds"] for l in ls] == [2000, 6500, 0, 2500]
    agg = ktrace.per_kernel(ls)
    assert agg["k_gemv"]["n"] == 2 and agg["k_gemv"]["adds"] == 9000 and agg["k_gemv"]["blocks"] == 4
    assert agg["k_norm"]["adds"] == 2000
    assert sum(s["adds"] for s in agg.values()) == max(l["end"] for l in ls)  # the adds partition the step
    # marks, in us after each block's wait (or its start where it has none):
    # k_gemv mark 0 = (4200 - 3200, 4300 - 3300, 10800 - 9800) / 3, mark 1 = 6000 - 3200
    # block ends after each launch's first wait (start where none waited):
    # grid 8 (w0 3200): 4800, 5800, 6300 -> p50 5800, p90 6300, last 6300;
    # grid 10 (start 9800): 2200. Grids 7 and 9 are one block each.
    tl = ktrace.tails(recs, ls, ktrace.kernel_names(units, str(tmp_path)), min_blocks=3)
    assert tl == {"k_gemv": (1, 5.8, 6.3, 6.3)}
    tl = ktrace.tails(recs, ls, ktrace.kernel_names(units, str(tmp_path)), min_blocks=1)
    assert tl["k_gemv"] == (2, (5.8 + 2.2) / 2, (6.3 + 2.2) / 2, (6.3 + 2.2) / 2) and tl["k_norm"][0] == 2
    mk = ktrace.marks(recs, ktrace.kernel_names(units, str(tmp_path)))
    assert list(mk) == ["k_gemv"]
    assert [(i, n, round(t, 3)) for i, n, t in mk["k_gemv"]] == [(0, 3, 1.0), (1, 1, 2.8)]


def test_printed_table(tmp_path):
    f = write(tmp_path)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "ktrace.py"), str(f), "--src", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "4 launches, 6 blocks, step 11.0 us (first block start to last block end)"
    row = lines[4].split()
    assert row[:4] == ["1", "k_gemv", "3", "2"] and row[-2:] == ["8.50", "6.50"]
    summary = [l.split() for l in lines if l.startswith("k_gemv ")][0]
    assert summary[1] == "2" and summary[-2:] == ["9.0", "81.8%"]
    assert lines[-1].split() == ["k_gemv", "0:", "3", "x", "1.00", "1:", "1", "x", "2.80"]


def test_reads_traces_without_marks(tmp_path):
    f = write(tmp_path)
    f.write_text("\n".join(" ".join(l.split()[:8]) if not l.startswith("#") else l for l in TRACE.splitlines()) + "\n")
    units, recs = ktrace.load(str(f))
    assert len(recs) == 6 and all(r[8] == () for r in recs)
    assert ktrace.marks(recs, ktrace.kernel_names(units, str(tmp_path))) == {}


def test_names_fall_back_to_file_and_line(tmp_path):
    f = write(tmp_path)
    units, recs = ktrace.load(str(f))
    name = ktrace.kernel_names(units, str(tmp_path / "elsewhere"))
    assert name(0, 9) == "unit.cu:9"
