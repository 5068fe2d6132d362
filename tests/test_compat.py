"""fastcoll.mlx_compat against mx.distributed's documented semantics, and against MLX itself.

- install()/uninstall()/patched() put MLX's own functions back exactly (in this process);
- one rank program (progs/compat_worker.py) checks shapes, dtypes, values, scalars, keyword
  arguments, the group of one, point to point, split, gradients, mlx.nn's sharded layers and
  nn.average_gradients, on worlds of 1, 2 and 3 ranks, on the eager path (FASTCOLL_MLX_GRAPH=0);
- the same mx.distributed calls run under MLX's own ring backend (mlx.launch) and under fastcoll
  give the same dtypes, shapes and values (progs/compat_mlxref.py);
- fastcoll's Group.split: sub-groups over the parent's connections (progs/compat_split.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import PROGS, ROOT, assert_ok, jobless_env, run_session
from engines import engines

mx = pytest.importorskip("mlx.core")


def test_install_uninstall_restore_mlx_functions():
    from fastcoll import mlx_compat

    originals = {name: getattr(mx.distributed, name) for name in mlx_compat.PATCHED}
    try:
        mlx_compat.install()
        for name in mlx_compat.PATCHED:
            assert getattr(mx.distributed, name) is getattr(mlx_compat, name)
        # mlx.nn looks the functions up on the module at call time, so the patch reaches it
        import mlx.nn.layers.distributed as nnd

        assert nnd.mx.distributed.all_sum is mlx_compat.all_sum
        with mlx_compat.patched():
            pass
        assert mlx_compat.installed()  # a nested patched() leaves an outer install() alone
    finally:
        mlx_compat.uninstall()
    for name in mlx_compat.PATCHED:
        assert getattr(mx.distributed, name) is originals[name]
    with mlx_compat.patched():
        assert mx.distributed.init is mlx_compat.init
    assert mx.distributed.init is originals["init"]
    mlx_compat.uninstall()  # uninstalling twice is harmless
    assert mx.distributed.Group is originals["init"]().__class__  # the class is never replaced


def test_strict_init_without_a_job_raises_as_mlx_does():
    code = (
        "import mlx.core as mx\n"
        "from fastcoll import mlx_compat\n"
        "mlx_compat.install()\n"
        "g = mx.distributed.init()\n"
        "assert (g.rank(), g.size()) == (0, 1)\n"
        "try:\n"
        "    mx.distributed.init(strict=True)\n"
        "except RuntimeError as e:\n"
        "    print('strict:', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "strict: [distributed] Couldn't initialize any backend" in p.stdout


@pytest.mark.parametrize("tuning, fast_sync, want", [
    ("", "0", (0, 0, 0)),  # an MLX program's waits sleep at once
    ("spin_us=150", "0", (150, 0, 0)),  # but for a knob the user set
    ("yield_us=7", "0", (0, 7, 0)),
    ("", "1", (-1, 5000, 0)),  # the fence gate's host half keeps its spin
    ("", "graph", (0, 2000, 1000)),  # in graph mode MLX's evaluation thread yields a while first
    ("long_wait_us=0", "graph", (0, 2000, 0)),  # (unless the last call of its kind waited long)
])
def test_mlx_programs_wait_asleep_unless_tuned(tuning, fast_sync, want):
    """Under mx.distributed the engine's waits sleep at once (config.for_mlx), since MLX evaluates
    on threads of its own beside the collectives; FASTCOLL_TUNING and the gate keep theirs."""
    code = (
        "import mlx.core as mx\n"
        "from fastcoll import mlx_compat\n"
        "mlx_compat.install()\n"
        "c = mx.distributed.init().fastcoll_group.config\n"
        "print('waits', c.spin_us, c.yield_us, c.long_wait_us)\n"
    )
    env = jobless_env() | {"FASTCOLL_TUNING": tuning, "FASTCOLL_FAST_SYNC": "0" if fast_sync == "graph" else fast_sync,
                          "FASTCOLL_MLX_GRAPH": "1" if fast_sync == "graph" else "0"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"waits {want[0]} {want[1]} {want[2]}" in p.stdout, p.stdout


@pytest.mark.parametrize("world", [1, 2, 3])
def test_compat_semantics(launch, world):
    # The eager path's semantics (mlx_compat.Group, the RuntimeError inside mx.compile): asked for.
    results = launch(world, "compat_worker.py", FASTCOLL_MLX_GRAPH="0").wait(timeout=90)
    assert_ok(results)
    for r in results:
        assert f"rank {r.rank}:" in r.out and "checks passed" in r.out, r.out


def _mlx_ring_run(outdir: str, timeout: float = 60) -> str:
    try:
        from mlx._distributed_utils import launch as _  # noqa: F401
    except ImportError:
        pytest.skip("MLX's launcher (mlx._distributed_utils.launch) is not available")
    argv = [
        sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()",
        "-n", "2", "--backend", "ring", "--", sys.executable, os.path.join(PROGS, "compat_mlxref.py"), "mlx", outdir,
    ]
    return run_session(argv, jobless_env(), timeout, merge_stderr=True)[1]


def _cases(outdir, which: str) -> dict:
    found = {}
    for path in sorted(outdir.glob(f"{which}-*.jsonl")):
        for line in path.read_text().splitlines():
            o = json.loads(line)
            found[(o.pop("rank"), o.pop("case"))] = o
    return found


@pytest.mark.parametrize("graph", ["0", "1"])
def test_same_results_as_mlx_ring_backend(launch, tmp_path, graph):
    """The same calls under MLX's ring backend and under fastcoll, eagerly and in graph mode
    (FASTCOLL_MLX_GRAPH=1: MLX's own collectives over fastcoll's MPI library, tests/test_graph.py)."""
    ours = launch(2, "compat_mlxref.py", "fastcoll", str(tmp_path), FASTCOLL_MLX_GRAPH=graph).wait(timeout=60)
    assert_ok(ours)
    mine = _cases(tmp_path, "fastcoll")
    log = _mlx_ring_run(str(tmp_path))
    theirs = _cases(tmp_path, "mlx")
    if not theirs:
        pytest.skip(f"MLX's ring backend wrote nothing here (no localhost ring?); its output:\n{log}")
    assert set(mine) == set(theirs)
    # MLX's ring backend refuses these two; fastcoll implements them (NCCL's and MPI's meaning),
    # in graph mode too (MLX's MPI backend asks MPI_Comm_split, which is fastcoll's split).
    extra = {"split", "sum_scatter"}
    for key in sorted(theirs):
        if key[1] in extra:
            assert "error" in theirs[key] and "error" not in mine[key], (key, theirs[key], mine[key])
            continue
        assert mine[key] == theirs[key], f"{key}: MLX {theirs[key]} fastcoll {mine[key]}"
    assert mine[(0, "sum_scatter")]["values"] == [1.0, 3.0] and mine[(1, "sum_scatter")]["values"] == [5.0, 7.0]


def test_split_subgroups(launch):
    results = launch(3, "compat_split.py").wait(timeout=60)
    assert_ok(results)
    for r in results:
        assert "checks passed" in r.out and "mismatch detected" in r.out, r.out


def _graph_runs() -> bool:
    """Whether graph mode can run in a job started here (the native engine and the library built)."""
    from fastcoll.engine import native_available
    from fastcoll.mlx_compat import graph

    return graph.library() is not None and native_available() is None


@pytest.mark.parametrize("setting", ["", "0"])
def test_run_unmodified_program_under_the_launcher(setting):
    """fastcoll-launch -n 2 python -m fastcoll.mlx_compat prog.py: a plain mx.distributed program.
    FASTCOLL_MLX_GRAPH unset, its group is MLX's own (graph mode: MLX's MPI backend over fastcoll's
    library) where graph mode can run, without a word; =0, the layer's own Group (the eager path)."""
    try:
        import fastcoll.launch.cli  # noqa: F401
    except ImportError as e:
        pytest.skip(f"fastcoll-launch is not importable: {e}")
    argv = [sys.executable, "-m", "fastcoll.launch", "-n", "2", "--timeout", "60", sys.executable, "-m",
            "fastcoll.mlx_compat", os.path.join(PROGS, "compat_plain.py"), "x", "--flag"]
    code, out, err = run_session(argv, jobless_env() | {"FASTCOLL_MLX_GRAPH": setting}, 90, cwd=ROOT)
    assert code == 0, err
    via = "mlx.core.distributed" if setting == "" and _graph_runs() else "fastcoll.mlx_compat"
    for r in range(2):
        assert f"plain rank {r} of 2: sum 3 via {via} argv ['x', '--flag']" in out, out
    assert "world of one" not in err, err  # the launcher's hint stays quiet under the compat layer
    assert "Warning" not in err, err  # neither path warns: graph mode, or the eager path asked for


@pytest.mark.parametrize("how", ["script", "module"])
def test_launcher_hints_an_mx_distributed_program_without_the_compat_layer(tmp_path, how):
    """`fastcoll-launch -n 2 python prog.py` for a program that uses mx.distributed alone: every
    rank is a world of one (MLX's own backends do not read fastcoll's settings) and is told how to
    run it; the environment's own sitecustomize still runs, and sys.path is the program's own."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    (tmp_path / "plainprog.py").write_text(
        "import os, sys\nimport mlx.core as mx\ng = mx.distributed.init()\n"
        "print('size', g.size(), 'theirs', os.environ.get('THEIRS'), 'hook', any('ranksite' in p for p in sys.path))\n")
    env = jobless_env()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "site")
    program, shown = (["plainprog.py"], "plainprog.py") if how == "script" else (["-m", "plainprog"], "-m plainprog")
    argv = [sys.executable, "-m", "fastcoll.launch", "-n", "2", "--timeout", "60", sys.executable, *program]
    code, out, err = run_session(argv, env, 90, cwd=str(tmp_path))
    assert code == 0, err
    assert sorted(out.splitlines()) == [f"[{r}] size 1 theirs ran hook False" for r in range(2)], out
    for r in range(2):
        assert (f"[{r}] mx.distributed.init() gave rank {r} a world of one, though fastcoll-launch started 2 "
                f"ranks: MLX's own backends do not read fastcoll's settings. Run the program under fastcoll's "
                f"compat layer: fastcoll-launch ... python -m fastcoll.mlx_compat {shown}\n") in err, err


def test_the_hint_for_python_c_is_a_command_that_runs(tmp_path):
    """`fastcoll-launch -n 2 python -c CODE ARG` for a program that uses mx.distributed alone: the
    hint names the code and its argument, quoted for a shell, and that very command (the
    launcher's options in place of its `...`) runs the program as a world of two."""
    code = "import sys\nimport mlx.core as mx\ng = mx.distributed.init()\nprint('size', g.size(), 'argv', sys.argv)\n"
    env = jobless_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    launcher = [sys.executable, "-m", "fastcoll.launch", "-n", "2", "--timeout", "60"]
    code_, out, err = run_session([*launcher, "python", "-c", code, "it's"], env, 90, cwd=str(tmp_path))
    assert code_ == 0, err
    assert sorted(out.splitlines()) == [f"[{r}] size 1 argv ['-c', \"it's\"]" for r in range(2)], out
    hint = re.search(r"^\[0\] mx\.distributed\.init\(\) gave rank 0 a world of one.*compat layer: "
                     r"(fastcoll-launch \.\.\. python -m fastcoll\.mlx_compat -c .*)$", err, re.M)
    assert hint, err
    command = hint.group(1)  # one line: the launcher tags each line of output
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + command], capture_output=True, text=True, timeout=30)
    assert words.stdout.split("\0")[-4:] == ["-c", code, "it's", ""], command
    # The hint's command, as a user pastes it into a shell: `...` is the launcher's options.
    shell = command.replace("fastcoll-launch ...", shlex.join(launcher), 1)
    code_, out, err = run_session(["bash", "-c", shell], env, 90, cwd=str(tmp_path))
    assert code_ == 0, err
    assert sorted(out.splitlines()) == [f"[{r}] size 2 argv ['-c', \"it's\"]" for r in range(2)], out
    assert "world of one" not in err, err


def test_runner_runs_code_as_python_c_does(tmp_path):
    """`python -m fastcoll.mlx_compat -c CODE ARGS`: the code runs as __main__ with sys.argv
    ['-c', ARGS], the working directory importable and mx.distributed fastcoll's; its exit
    code and errors are the program's; without CODE it is a usage error."""
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    code = ("import sys, helper\nimport mlx.core as mx\n"
            "print(__name__, sys.argv, helper.VALUE, mx.distributed.init.__module__)\nsys.exit(4)\n")
    r = subprocess.run([sys.executable, "-m", "fastcoll.mlx_compat", "-c", code, "a", "-b"], cwd=tmp_path,
                       env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r.stderr
    assert r.stdout == "__main__ ['-c', 'a', '-b'] 7 fastcoll.mlx_compat.api\n"
    r = subprocess.run([sys.executable, "-m", "fastcoll.mlx_compat", "-c", "1/0"], cwd=tmp_path,
                       env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.endswith("ZeroDivisionError: division by zero\n"), r.stderr
    r = subprocess.run([sys.executable, "-m", "fastcoll.mlx_compat", "-c"], cwd=tmp_path,
                       env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "(-m MODULE | -c CODE | SCRIPT)" in r.stderr, r.stderr


def test_runner_imports_beside_the_script_as_python_does(tmp_path):
    """`python -m fastcoll.mlx_compat DIR/app.py` puts DIR first on sys.path, as `python
    DIR/app.py` does, so the script imports the module beside it; a missing script is one line."""
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "app" / "main.py").write_text(
        "import sys\nimport mlx.core as mx\nimport helper\n"
        "print(helper.VALUE, sys.path[0], sys.argv, mx.distributed.init.__module__)\n")
    plain = subprocess.run([sys.executable, "app/main.py", "a"], cwd=tmp_path, env=jobless_env(),
                           capture_output=True, text=True, timeout=60)
    ours = subprocess.run([sys.executable, "-m", "fastcoll.mlx_compat", "app/main.py", "a"],
                          cwd=tmp_path, env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and ours.returncode == 0, plain.stderr + ours.stderr
    value, path, argv, _ = plain.stdout.split(" ", 3)
    assert ours.stdout.split(" ", 3)[:3] == [value, path, argv] == ["42", str(tmp_path / "app"), "['app/main.py',"]
    assert ours.stdout.split()[-1] == "fastcoll.mlx_compat.api"  # and mx.distributed is fastcoll's
    missing = subprocess.run([sys.executable, "-m", "fastcoll.mlx_compat", "app/nope.py"], cwd=tmp_path,
                             env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert missing.stderr == "python -m fastcoll.mlx_compat: can't open file 'app/nope.py': no such file or directory\n"


def test_init_checks_all_gather_factory_as_mlx_does():
    """mx.distributed.init's all_gather_factory: TypeError unless callable, ValueError with a
    backend other than "jaccl"; accepted with "jaccl". mlx_compat.init must answer alike."""
    code = (
        "import json\n"
        "import mlx.core as mx\n"
        "from fastcoll import mlx_compat\n"
        "def outcome(init, backend, factory):\n"
        "    try:\n"
        "        return init(backend=backend, all_gather_factory=factory).size()\n"
        "    except Exception as e:\n"
        "        return type(e).__name__\n"
        "f = lambda rank, size: (lambda src, n: src)\n"
        "cases = [('ring', f), ('any', f), ('mpi', f), ('jaccl', 3), ('any', 'x'), ('jaccl', f)]\n"
        "mlx = [outcome(mx.distributed.init, b, c) for b, c in cases]\n"
        "ours = [outcome(mlx_compat.init, b, c) for b, c in cases + [('fastcoll', f)]]\n"
        "print(json.dumps([mlx, ours]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=jobless_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    mlx, ours = json.loads(p.stdout)
    assert mlx == ["ValueError", "ValueError", "ValueError", "TypeError", "TypeError", 1], mlx
    assert ours == mlx + ["ValueError"]


@pytest.mark.parametrize("engine", engines())
def test_a_gated_all_sum_is_the_kernel_alone_unless_mlx_differentiates_it(launch, engine):
    """Outside MLX's transformations mlx_compat leaves out the custom function (two graph nodes a
    call); inside mx.grad, value_and_grad, vjp and mlx.nn's value_and_grad, and whenever it is not
    installed, it keeps its vjp; a grad made before install() raises, never a wrong gradient."""
    env = {"FASTCOLL_FAST_SYNC": "1", "FASTCOLL_GATE_MAX_BYTES": "4096",
           "FASTCOLL_TUNING": "gate_direct=0,gate_host_min_bytes=1",
           "FASTCOLL_MLX_GRAPH": "0"}  # the gate is the eager path's (graph mode's collectives are MLX's)
    results = launch(2, "compat_gated.py", FASTCOLL_NATIVE=engine, **env).wait(timeout=120)
    assert_ok(results)
    for res in results:
        assert "OK 8 5" in res.out, res.out + res.err[-3000:]


def test_mlx_transformations_are_counted_while_installed():
    from fastcoll import mlx_compat
    from fastcoll.mlx_compat import tracing

    originals = {name: getattr(mx, name) for name in tracing.RETURNING + tracing.IMMEDIATE}
    seen = []

    def f(v):
        seen.append(tracing.untraced())
        return (v * v).sum()

    assert not tracing.untraced()  # not installed: nothing is counted, so nothing counts as untraced
    try:
        with mlx_compat.patched():
            assert mx.grad(f)(mx.array([3.0])).item() == 6.0
            mx.vjp(f, [mx.array([1.0])], [mx.array(1.0)])
            mx.jvp(f, [mx.array([1.0])], [mx.array([1.0])])
            mx.vmap(f)(mx.ones((2, 1)))
            with pytest.raises(ZeroDivisionError):
                mx.grad(lambda v: 1 / 0)(mx.array(1.0))
            f(mx.array([1.0]))
            theirs = mx.grad = (lambda grad: lambda *a, **k: grad(*a, **k))(mx.grad)  # wraps ours
        assert seen == [False, False, False, False, True], seen  # the failed grad left its count
        assert not tracing.untraced()
        assert mx.grad is theirs  # uninstall() leaves a later wrapper where it is
        for name, fn in originals.items():
            assert name == "grad" or getattr(mx, name) is fn
    finally:
        mlx_compat.uninstall()
        for name, fn in originals.items():
            setattr(mx, name, fn)
