"""Run `sglang.bench_serving` as `python3 -m sglang.bench_serving` would, but
without executing the package __init__ files `sglang/__init__.py` (frontend
language: IPython, pydantic, ...) and `sglang/srt/utils/__init__.py` (the server
runtime: torch, triton, torchvision, starlette, orjson, ...), which the benchmark
client never uses.  bench_serving.py, sglang/benchmark/* and
sglang/srt/utils/network.py run unmodified.

Modules imported at top level only by dataset loaders we do not use (PIL for
--dataset-name image, HF `datasets` for mmmu) get a placeholder while
sglang.benchmark.datasets is imported, if and only if they are not installed;
the placeholders are removed again before the benchmark starts.
"""
import importlib.util
import os
import runpy
import sys
import types


class _Missing:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *a, **k):
        raise ImportError(f"{self._name}: module not installed on this machine")


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


def _bare_package(name, path):
    m = types.ModuleType(name)
    m.__path__ = [path]
    m.__package__ = name
    m.__file__ = os.path.join(path, "__init__.py")
    sys.modules[name] = m
    return m


def main():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglbench_launch: sglang is not importable (PYTHONPATH?)")
    root = list(spec.submodule_search_locations)[0]
    pkg = _bare_package("sglang", root)
    _bare_package("sglang.srt", os.path.join(root, "srt"))
    pkg.srt = sys.modules["sglang.srt"]
    _bare_package("sglang.srt.utils", os.path.join(root, "srt", "utils"))
    sys.modules["sglang.srt"].utils = sys.modules["sglang.srt.utils"]
    try:
        from sglang.version import __version__

        pkg.__version__ = __version__
    except Exception:
        pass

    # transformers first, so that its optional-dependency probes never see a
    # placeholder.
    import transformers

    transformers.AutoTokenizer, transformers.AutoProcessor
    transformers.PreTrainedTokenizerBase

    stubs = []
    for name, subs in (("PIL", ("Image",)), ("datasets", ())):
        if importlib.util.find_spec(name) is not None:
            continue
        m = _StubModule(name)
        m.__path__ = []
        sys.modules[name] = m
        stubs.append(name)
        for s in subs:
            sm = _StubModule(f"{name}.{s}")
            sys.modules[sm.__name__] = sm
            setattr(m, s, sm)
            stubs.append(sm.__name__)
    import sglang.benchmark.datasets  # noqa: F401  (image.py, mmmu.py)

    for name in stubs:
        sys.modules.pop(name, None)
    if stubs:
        print(f"[sglbench] not installed, placeholders used only to import the "
              f"unused image/mmmu loaders: {', '.join(stubs)}", file=sys.stderr)

    sys.argv[0] = os.path.join(root, "bench_serving.py")
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
