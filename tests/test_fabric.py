"""The test fabric (tests/fabric/): a verbs provider over shared memory, with UC's behaviour, that
fastcoll's RDMA link is tested on. Built here, then driven by two C programs that load it with
dlopen/dlsym as the link does: pingpong.c (two real processes, queue pairs brought up as MLX's
JACCL brings them up) and checks.c (the error paths, in one process)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import ROOT, fabric_build, fabric_missing, run_session

FABRIC = os.path.join(ROOT, "tests", "fabric")
VERBS = ["ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
         "ibv_close_device", "ibv_query_device", "ibv_query_port", "ibv_query_gid", "ibv_alloc_pd",
         "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp",
         "ibv_destroy_qp", "ibv_modify_qp", "ibv_query_qp"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
            "-g", "-O1"]


build = fabric_build()


def why_not() -> str | None:
    """Why the fabric cannot be built here, or None."""
    return fabric_missing()


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    """The library (built in tests/fabric/build unless up to date) and both programs."""
    out = str(tmp_path_factory.mktemp("fabric"))
    return {"lib": build.build(), "pingpong": build.program("pingpong", out),
            "checks": build.program("checks", out)}


@pytest.fixture
def fdir():
    """A directory of inboxes for this test alone, removed whatever happens."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="fcfab-test-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(prog: str, lib: str, fdir: str, *args: str, **env: str) -> tuple[int, str, str]:
    """Run a test program on the fabric in `fdir`: (exit code, stdout, stderr), bounded."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FCFAB_")}
    e.update(FASTCOLL_VERBS_LIB=lib, FCFAB_DIR=fdir, **env)
    return run_session([prog, *args], e, timeout=90)


def ok(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 0, f"exit {code}\n{out}\n{err}"
    return out


def test_it_exports_the_verbs_the_link_resolves_and_nothing_of_its_own(progs):
    lib = ctypes.CDLL(progs["lib"])
    for name in VERBS:
        assert getattr(lib, name), name
    for internal in ("fc_post_send", "fc_poll_cq", "fc_config"):
        with pytest.raises(AttributeError):
            getattr(lib, internal)
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", progs["lib"]], capture_output=True, text=True).stdout
        assert sorted(line.split()[-1] for line in out.splitlines()) == sorted(VERBS)


@pytest.mark.parametrize("rc", [False, True], ids=["UC", "RC"])
def test_two_processes_ping_pong_every_size(progs, fdir, rc):
    sizes = ["8", "9", "64", "65", "1000", "4096", "65536", str(1 << 20)]
    out = ok(run(progs["pingpong"], progs["lib"], fdir, *(["--rc"] if rc else []), "ping", "3", *sizes))
    assert "A: ping ok 24" in out and "B: ping ok 24" in out
    assert os.listdir(fdir) == []  # every inbox unlinked at destroy_qp


def got(out: str) -> list[int]:
    line = re.search(r"^B: got(.*)$", out, re.M)
    assert line, out
    return [int(x) for x in line.group(1).split()]


@pytest.mark.parametrize("fault,rc,want", [
    ("", False, [1, 2, 3, 4, 5, 6, 7, 8]),
    ("drop:3", False, [1, 2, 4, 5, 6, 7, 8]),
    ("dup:2", False, [1, 2, 2, 3, 4, 5, 6, 7, 8]),
    ("drop:2,dup:4,drop:8", False, [1, 3, 4, 4, 5, 6, 7]),
    ("drop:3,dup:5", True, [1, 2, 3, 4, 5, 6, 7, 8]),  # faults are for UC only
])
def test_faults_the_sender_asks_for(progs, fdir, fault, rc, want):
    out = ok(run(progs["pingpong"], progs["lib"], fdir, *(["--rc"] if rc else []), "stream", "8", "256", "300",
                 FCFAB_FAULT=fault))
    assert "A: sent 8" in out
    assert got(out) == want


def test_a_delayed_message_arrives_late_and_what_follows_waits_behind_it(progs, fdir):
    out = ok(run(progs["pingpong"], progs["lib"], fdir, "stream", "8", "256", "1500", FCFAB_FAULT="delay:1:300000"))
    assert got(out) == [1, 2, 3, 4, 5, 6, 7, 8]
    first = int(re.search(r"first_us (\d+)", out).group(1))
    assert first >= 300000, out  # the first message to arrive, whichever it is, came after the delay


def test_a_send_with_no_receive_posted_is_dropped(progs, fdir):
    out = ok(run(progs["pingpong"], progs["lib"], fdir, "noreceive"))
    assert got(out) == [2]


def test_a_killed_peer_gives_no_error_and_its_inbox_is_swept_later(progs, fdir):
    out = ok(run(progs["pingpong"], progs["lib"], fdir, "kill"))
    assert "A: sends 8 success 8 errors 0 extra 0" in out
    assert len(os.listdir(fdir)) == 1  # the dead side's inbox: nobody unlinked it
    ok(run(progs["pingpong"], progs["lib"], fdir, "ping", "1", "64"))
    assert os.listdir(fdir) == []  # the next process to open a device swept it


def test_a_message_longer_than_the_receive_is_a_length_error(progs, fdir):
    out = ok(run(progs["pingpong"], progs["lib"], fdir, "lenerr"))
    assert "A: send SUCCESS state 3" in out  # IBV_QPS_RTS: the sender sees nothing wrong
    assert "B: recv LOC_LEN_ERR state 6" in out  # IBV_QPS_ERR


def reports(path: str) -> list[str]:
    found = sorted(f for f in os.listdir(os.path.dirname(path)) if f.startswith(os.path.basename(path) + "."))
    lines = []
    for f in found:
        with open(os.path.join(os.path.dirname(path), f)) as fh:
            lines.append(fh.read().strip())
    return lines


@pytest.mark.parametrize("keep", [False, True], ids=["closed", "left-open"])
def test_the_leak_report_counts_what_is_still_open_at_exit(progs, fdir, tmp_path, keep):
    report = str(tmp_path / "report")
    ok(run(progs["pingpong"], progs["lib"], fdir, *(["--keep"] if keep else []), "ping", "1", "64",
           FCFAB_REPORT=report))
    lines = reports(report)
    assert len(lines) == 2, lines  # one for each process
    n = 1 if keep else 0
    for line in lines:
        assert re.fullmatch(rf"\d+ ctx {n} pd {n} mr {n} cq {n} qp {n}", line), line
    assert os.listdir(fdir) == []  # left open or not, no inbox outlives its process


def test_the_error_paths(progs, fdir):
    out = ok(run(progs["checks"], progs["lib"], fdir, FCFAB_DEVICES="3"))
    for part in ("devices 3", "port", "states UC", "states RC", "depths", "errors", "busy overrun", "reset", "all"):
        assert f"ok {part}" in out, out


@pytest.mark.parametrize("var,value", [("FCFAB_FAULT", "drop:0"), ("FCFAB_FAULT", "delay:3"),
                                       ("FCFAB_FAULT", "drop:1,,dup:2"), ("FCFAB_DEVICES", "17")])
def test_a_bad_setting_is_one_line_naming_it(progs, fdir, var, value):
    code, out, err = run(progs["pingpong"], progs["lib"], fdir, "ping", "1", "64", **{var: value})
    assert code != 0
    assert f"fcfab: {var}={value}: want" in err, err


def test_a_directory_others_may_write_in_is_refused(progs, fdir):
    os.chmod(fdir, 0o777)
    code, out, err = run(progs["pingpong"], progs["lib"], fdir, "ping", "1", "64")
    assert code != 0
    assert "no one else may write in" in err, err


def test_build_py_prints_the_path_last_and_builds_only_when_something_changed(tmp_path):
    argv = [sys.executable, os.path.join(FABRIC, "build.py"), str(tmp_path)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lib = first.stdout.splitlines()[-1]
    assert first.returncode == 0 and lib == os.path.join(str(tmp_path), build.LIBRARY), first
    mtime = os.stat(lib).st_mtime_ns
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.stdout.splitlines()[-1] == lib and os.stat(lib).st_mtime_ns == mtime
    env = dict(os.environ, CFLAGS="-Werror -DFCFAB_REBUILD_CHECK")  # other flags: built again
    assert subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode == 0
    assert os.stat(lib).st_mtime_ns != mtime


def test_build_py_says_what_to_install_without_verbs_h(tmp_path):
    env = dict(os.environ, CFLAGS="-nostdinc")  # the compiler finds no system header, verbs.h included
    p = subprocess.run([sys.executable, os.path.join(FABRIC, "build.py"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"build.py: {build.NO_VERBS}"]


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_it_builds_warning_free(cc, tmp_path):
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    build.build(str(tmp_path), cc=cc, cflags=[], ldflags=[], werror=True)
    build.program("pingpong", str(tmp_path), cc=cc)
    build.program("checks", str(tmp_path), cc=cc)


def sanitizers_work(cc: str, tmp: str) -> bool:
    src = os.path.join(tmp, "t.c")
    with open(src, "w") as f:
        f.write("int main(void) { return 0; }\n")
    p = subprocess.run([cc, *SANITIZE, "-o", os.path.join(tmp, "t"), src], capture_output=True, timeout=120)
    return p.returncode == 0


def test_under_address_and_undefined_behaviour_sanitizers(tmp_path, fdir):
    cc = build.compiler()
    if not sanitizers_work(cc, str(tmp_path)):
        pytest.skip(f"{cc} cannot build with -fsanitize=address,undefined here")
    lib = build.build(str(tmp_path), cflags=SANITIZE, ldflags=SANITIZE[:1], werror=True)
    pp = build.program("pingpong", str(tmp_path), cflags=SANITIZE)
    checks = build.program("checks", str(tmp_path), cflags=SANITIZE)
    env = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    assert "ok all" in ok(run(checks, lib, fdir, **env))
    assert "A: ping ok 4" in ok(run(pp, lib, fdir, "ping", "1", "8", "65", "4096", str(1 << 20), **env))
    assert got(ok(run(pp, lib, fdir, "stream", "8", "256", "400", FCFAB_FAULT="dup:2,drop:5,delay:6:50000",
                      **env))) == [1, 2, 2, 3, 4, 6, 7, 8]
    assert "errors 0" in ok(run(pp, lib, fdir, "kill", **env))
    assert "LOC_LEN_ERR" in ok(run(pp, lib, fdir, "lenerr", **env))
    assert "B: ping ok 1" in ok(run(pp, lib, fdir, "--keep", "ping", "1", "64", **env))
