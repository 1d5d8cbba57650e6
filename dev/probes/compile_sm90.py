"""Probe: every Triton kernel launch the CPU tests make, compiled for an H100/H200 (sm_90) on a machine without a
GPU: a compile error found here costs no device time. Registers and spills come with it (this machine's triton
and ptxas; the GPU machine's triton may compile differently).

    python dev/probes/compile_sm90.py [PYTEST ARGS ...]        # default: the kernel tests (DEFAULT below)
    python dev/probes/compile_sm90.py tests/test_kernels.py -k flat --json /tmp/sm90.json

The tests run under the interpreter (TRITON_INTERPRET=1) with each launch recorded: the kernel, its arguments'
types (tensors as pointers of their dtype, 16-byte aligned ones marked so; integers equal to 1 as constants, as
a launch does), its constexprs, warps, stages and register cap. Each distinct launch is then compiled with
``triton.compile`` for sm_90 and assembled with triton's ptxas. Where the interpreter's stand-ins differ from the
GPU's choice, the GPU's variant is compiled too: bf16 products are interpreted with fp32 operands (OPS "tf32",
or F32 in the attention kernels) and the GPU takes half ones; tiles go through pointers on the CPU unless a test
asks for tensor descriptors, and the GPU takes descriptors (TMA True) where a kernel has the switch and the
strides allow.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile

COMPILING = len(sys.argv) > 1 and sys.argv[1] == "--compile"
if not COMPILING:  # the tests run under the interpreter; the compiling child must not
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
          torch.int32: "i32", torch.int64: "i64", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
DEFAULT = ["tests/test_kernels.py", "tests/test_kernels_grad.py", "tests/test_attn_chunk.py",
           "tests/test_decode_ops.py", "tests/test_decode_step.py", "tests/test_skinny_mm.py", "tests/test_quant.py",
           "tests/test_engine_fp8kv.py"]
LAUNCH_OPTS = ("num_warps", "num_stages", "maxnreg", "num_ctas")
SEEN: dict = {}


def _key(fn, args, kwargs):
    """(kernel, signature, constexprs, attrs, options) of one launch, hashable."""
    names = list(inspect.signature(fn).parameters)
    jit = _jit(fn)
    cidx = set(jit.constexprs)
    sig, const, attrs = {}, {}, {}
    vals = dict(zip(names, args), **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTS})
    for i, n in enumerate(names):
        v = vals.get(n, jit.params[i].default if jit.params[i].has_default else None)
        if i in cidx:
            sig[n], const[n] = "constexpr", v
        elif v is None:
            sig[n], const[n] = "constexpr", None
        elif isinstance(v, torch.Tensor):
            sig[n] = "*" + DTYPES[v.dtype]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = (("tt.divisibility", 16),)
        elif isinstance(v, bool):
            sig[n] = "i1"
        elif isinstance(v, int):
            if v == 1:
                sig[n], const[n] = "constexpr", 1
            else:
                sig[n] = "i32" if -2**31 <= v < 2**31 else "i64"
                if v % 16 == 0:
                    attrs[(i,)] = (("tt.divisibility", 16),)
        elif isinstance(v, float):
            sig[n] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {n} of type {type(v).__name__}")
    opts = tuple((k, kwargs[k]) for k in LAUNCH_OPTS if kwargs.get(k) is not None)
    const = tuple((k, v if v is None or isinstance(v, (bool, int, float, str)) else str(v)) for k, v in const.items())
    return (fn.__module__, fn.__name__, tuple(sig.items()), const, tuple(sorted(attrs.items())), opts)


_JITS: dict = {}


def _jit(fn):
    if fn not in _JITS:
        _JITS[fn] = JITFunction(fn)
    return _JITS[fn]


def _record(self, *args, grid, warmup, **kwargs):
    try:
        k = _key(self.fn, args, kwargs)
        SEEN.setdefault(k, 0)
        SEEN[k] += 1
    except Exception as e:  # a probe: note it, let the test go on
        SEEN.setdefault(("error", self.fn.__name__, repr(e)), 0)
    return _orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)


_orig_run = interpreter.InterpretedFunction.run
interpreter.InterpretedFunction.run = _record


def gpu_twins(const: dict, sig: dict, attrs: dict) -> list[dict]:
    """The launch as recorded and, where the GPU would choose otherwise, the GPU's variant: half operands for
    the interpreter's fp32 ones; tensor descriptors where the kernel has the switch and every row stride
    (arguments ``s_*``) is a multiple of 16 elements (else the wrappers keep pointers: 16-byte rows)."""
    twin = dict(const)
    if twin.get("OPS") == "tf32":
        twin["OPS"] = "half"
    if twin.get("F32") is True and any(t in ("*bf16", "*fp16") for t in sig.values()):
        twin["F32"] = False  # the attention kernels: fp32 products in the interpreter for 16-bit inputs
    names = list(sig)
    strides_ok = all(sig[n] != "constexpr" and ((names.index(n),) in attrs) for n in names if n.startswith("s_"))
    for k in ("TMA", "tma"):
        if twin.get(k) is False and strides_ok:
            twin[k] = True
    return [const] if twin == const else [const, twin]


def variants(keys) -> list:
    """The distinct (launch, GPU twin) pairs to compile, in order."""
    out, done = [], set()
    for key in keys:
        if key[0] == "error":
            out.append(key)
            continue
        mod, name, sig, const, attrs, opts = key
        for c in gpu_twins(dict(const), dict(sig), dict(attrs)):
            ident = (mod, name, sig, tuple(c.items()), attrs, opts)
            if ident not in done:
                done.add(ident)
                out.append(ident)
    return out


def compile_from(todo, start: int, path: str) -> None:
    """In the child (no interpreter): variants start.. compiled for sm_90, a JSON line each as it ends (a
    compiler abort kills the child; the parent notes it and goes on after it)."""
    from offline_regs import compile_info

    with open(path, "a") as f:
        for v in todo[start:]:
            if v[0] == "error":
                row = dict(kernel=v[1], ok=False, error=v[2])
            else:
                mod, name, sig, const, attrs, opts = v
                fn = getattr(importlib.import_module(mod), name)
                c, opts = dict(const), dict(opts)
                row = dict(kernel=name, const={k: x for k, x in c.items() if x is not None}, **opts)
                try:
                    info = compile_info(fn, dict(sig), c, opts.get("num_warps", 4), opts.get("num_stages", 3),
                                        opts.get("maxnreg"), {k: [list(a) for a in x] for k, x in attrs})
                    row.update(ok=True, **info)
                except Exception as e:
                    lines = [x for x in str(e).strip().splitlines() if x.strip(" ^")]
                    row.update(ok=False, error=" | ".join(lines[-3:])[:400] if lines else repr(e))
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def main():
    import pytest

    if COMPILING:
        with open(sys.argv[2]) as f:
            todo = [_tuples(k) for k in json.load(f)]
        compile_from(todo, int(sys.argv[4]), sys.argv[3])
        return
    argv = sys.argv[1:]
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if not argv:
        argv = DEFAULT
    pytest.main(["-q", "-p", "no:cacheprovider", *argv])
    todo = variants(list(SEEN))
    with tempfile.TemporaryDirectory() as tmp:
        kf, rf = os.path.join(tmp, "todo.json"), os.path.join(tmp, "rows.jsonl")
        with open(kf, "w") as f:
            json.dump([list(k) for k in todo], f)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = 0
        while done < len(todo):
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile", kf, rf, str(done)], env=env,
                               capture_output=True, text=True)
            with open(rf) as f:
                done = sum(1 for _ in f)
            if r.returncode and done < len(todo):  # the compiler died on variant `done`
                v = todo[done]
                lines = [x for x in r.stderr.strip().splitlines() if x.strip() and "Warning" not in x
                         and "warn_once" not in x and "Traceback" not in x]
                tail = (lines or ["?"])[0][:300]
                with open(rf, "a") as f:
                    f.write(json.dumps(dict(kernel=v[1], const=dict(v[3]), opts=dict(v[5]), ok=False,
                                            error=f"compiler aborted: {tail}"), default=str) + "\n")
                done += 1
        with open(rf) as f:
            rows = [json.loads(line) for line in f]
    bad = [r for r in rows if not r["ok"]]
    for r in rows:
        mark = "ok " if r["ok"] else "ERR"
        what = (f"regs {r['regs']:3d} spills {r['spill_st']:5d} shared {r['shared']:6d}" if r["ok"]
                else r["error"])
        print(f"{mark} {r['kernel']:28s} w{r.get('num_warps', 4)} s{r.get('num_stages', 3)}  {what}")
    print(f"{len(rows)} variants of {len({r['kernel'] for r in rows})} kernels compiled for sm_90 "
          f"(triton {triton.__version__}); {len(bad)} failed")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
