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


def test_overlap_with_the_next_launch(tmp_path):
    f = write(tmp_path)
    units, recs = ktrace.load(str(f))
    name = ktrace.kernel_names(units, str(tmp_path))
    ls = ktrace.launches(recs, name)
    # k_gemv's grid 8 (first wait 3200) against grid 9 (k_norm, one block
    # 2000-9400 waiting until 8900); grid 10 is the last launch: no next.
    # Every 1000 ns from 3200 to 9200 (the last end, 9500, rounds down)
    n, nxt, rows = ktrace.overlap(recs, ls, "k_gemv")
    assert (n, nxt) == (1, ["k_norm"])
    assert [r[0] for r in rows] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [r[1] for r in rows] == [3, 3, 3, 3, 3, 2, 1]  # ends at 8000, 9000, 9500
    assert [r[2] for r in rows] == [1] * 7
    assert [r[3] for r in rows] == [1, 1, 1, 1, 1, 1, 0]  # its wait returns at 8900
    # k_norm: grid 7 (no wait: from its start, 1000) against grid 8, and
    # grid 9 (wait 8900) against grid 10, averaged; grid 8's blocks start at
    # 1500-1700 and wait until 3200-3300
    n, nxt, rows = ktrace.overlap(recs, ls, "k_norm")
    assert (n, nxt) == (2, ["k_gemv"])
    assert rows[0] == (0.0, 1.0, 0.0, 0.0)  # 1000: grid 7 runs; 8900: grid 9 runs, 10 not started
    assert rows[1] == (1.0, 0.5, 2.0, 1.5)  # 2000: grid 7, all 3 of 8 before their wait; 9900: grid 10 resident, no wait
    assert rows[2] == (2.0, 0.0, 2.0, 1.5)  # 3000: grid 7 ended, 8 still before its wait; 10900: as at 9900
    # grid 7's pair ends at 9500, 8 steps after 1000, grid 9's at 12000, 3
    # after 8900: a step past a pair's end counts 0 for it
    assert len(rows) == 9 and rows[8] == (8.0, 0.0, 0.5, 0.0)


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
