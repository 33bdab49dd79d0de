"""Evaluation children forked by the fork server (evaluators/child/zygote.py): what one sees and can do.

Each test runs probe code as a task's module in a real reference child (the task's code runs
there as a candidate's would in a candidate child): the probe gathers facts and raises them,
and the test reads them from the error.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap

import pytest

from kernel_env.evaluators import forkserver
from kernel_env.evaluators.child import protocol
from kernel_env.evaluators.child.protocol import Setup
from kernel_env.evaluators.children import Child, ChildError, CommandFailed
from kernel_env.sandbox.bwrap import bubblewrap_problem

pytestmark = pytest.mark.skipif(bubblewrap_problem() is not None,
                                reason=f"children are isolated only with bubblewrap: {bubblewrap_problem()}")

ENV = {"CUDA_VISIBLE_DEVICES": ""}
_PROBE = textwrap.dedent("""
    import ctypes, json, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    facts = {}

    def attempt(fn):
        try:
            fn()
            return "done"
        except OSError as exc:
            return exc.errno

    def write(path):
        return attempt(lambda: open(path, "w").write("x"))

    def call(result):
        return 0 if result == 0 else ctypes.get_errno()

    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
""")


def probe(body: str, child: Child | None = None) -> dict:
    """Run ``body`` (probe code that fills ``facts``) in a reference child; the facts it found."""
    own = child is None
    child = child or Child.spawn("judge", env=ENV, gpu=False, label="test-children")
    try:
        with pytest.raises(CommandFailed) as failed:
            child.call(Setup(device="cpu", out_dir=child.path("/job/ref"),
                             task_code=_PROBE + textwrap.dedent(body) + '\nraise RuntimeError("FACTS " + json.dumps(facts))\n'),
                       None, 120)
    finally:
        if own:
            child.discard()
    error = str(failed.value)
    assert "FACTS " in error, error
    return json.loads(error[error.index("FACTS ") + 6:].splitlines()[0])


def test_a_child_is_the_first_process_of_its_own_namespace_and_sees_no_other():
    facts = probe("""
        facts["pid"] = os.getpid()
        facts["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        facts["uid"] = os.getuid()
    """)
    assert facts == {"pid": 1, "pids": [1], "uid": 1000}


def test_a_child_sees_its_own_job_directories_and_nothing_of_other_jobs():
    other = Child.spawn("worker", env=ENV, gpu=False, label="test-children")
    try:
        (other.host_paths["/job/cand"] / "secret").write_text("x")
        child = Child.spawn("judge", env=ENV, gpu=False, label="test-children")
        (child.host_paths["/job/ref"] / "mine").write_text("x")
        facts = probe("""
            facts["ref"] = os.listdir("/job/ref")
            facts["snapshot"] = os.listdir("/job/snapshot")
            facts["jobs"] = attempt(lambda: os.listdir("/jobs"))
            facts["write jobs"] = write("/jobs/x")
            facts["hunt"] = [os.path.join(d, n) for top in ("/tmp", "/dev", "/run", "/job")
                             for d, _, names in os.walk(top) for n in names if n == "secret"]
        """, child)
        child.discard()
    finally:
        other.discard()
    assert sorted(facts["ref"]) == [protocol.CALLS_GATE, protocol.CALLS_LOCK, "mine"] and facts["snapshot"] == [] and facts["hunt"] == [], facts
    assert facts["jobs"] != "done" and facts["write jobs"] != "done", facts


def test_nothing_a_child_writes_outside_its_job_directories_reaches_another_child():
    first = probe("""
        facts = {path: write(path) for path in ("/tmp/mark", "/dev/shm/mark", "/mark", "/dev/mark", "/job/mark",
                                                 "/run/mark", "/proc/sys/kernel/core_pattern")}
    """)
    assert first["/tmp/mark"] == "done" and first["/dev/shm/mark"] == "done", first
    assert all(first[path] != "done" for path in ("/mark", "/dev/mark", "/job/mark", "/run/mark",
                                                  "/proc/sys/kernel/core_pattern")), first
    second = probe("""
        facts["tmp"] = sorted(os.listdir("/tmp"))
        facts["shm"] = os.listdir("/dev/shm")
    """)
    # The interpreter's own folders under /tmp (a venv or checkout there) are bound back read-only.
    interpreter = {os.path.realpath(path) for path in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    tops = {path.split("/")[2] for path in interpreter if path.startswith("/tmp/")}
    assert second == {"tmp": sorted({"home", *tops}), "shm": []}, second


def test_a_child_has_no_capability_and_cannot_uncover_what_is_hidden():
    facts = probe("""
        facts["caps"] = [status[name].strip() for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")]
        facts["no new privileges"] = status["NoNewPrivs"].strip()
        facts["umount jobs"] = call(libc.umount2(b"/jobs", 2))
        facts["umount proc"] = call(libc.umount2(b"/proc", 2))
        facts["umount proc/sys"] = call(libc.umount2(b"/proc/sys", 2))
        os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNS)  # all capabilities again, in a namespace of its own
        facts["nested umount jobs"] = call(libc.umount2(b"/jobs", 2))
        facts["nested umount proc/sys"] = call(libc.umount2(b"/proc/sys", 2))
        facts["nested remount proc/sys"] = call(libc.mount(None, b"/proc/sys", None, 0x1000 | 0x20, None))
        os.makedirs("/tmp/proc")
        facts["nested mount proc"] = call(libc.mount(b"proc", b"/tmp/proc", b"proc", 0, None))
    """)
    assert facts.pop("caps") == ["0000000000000000"] * 4
    assert facts.pop("no new privileges") == "1"
    assert all(code != 0 for code in facts.values()), facts


def test_a_child_has_a_network_of_its_own_with_loopback_alone():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        port = listener.getsockname()[1]
        facts = probe(f"""
            facts["interfaces"] = [name for _, name in socket.if_nameindex()]
            facts["host port"] = attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
        """)
    finally:
        listener.close()
    assert facts["interfaces"] == ["lo"] and facts["host port"] != "done", facts


def test_a_child_holds_only_its_own_descriptors_and_limits():
    facts = probe("""
        facts["fds"] = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                        if os.path.exists(f"/proc/self/fd/{fd}")}
        facts["limits"] = [line.split()[-3:-1] for line in open("/proc/self/limits") if line.startswith(("Max core", "Max open"))]
    """)
    sockets = [fd for fd, target in facts["fds"].items() if target.startswith("socket:")]
    assert sockets == ["4"], facts["fds"]  # the parent socket: never the fork server's
    assert facts["limits"] == [["0", "0"], ["4096", "4096"]], facts["limits"]


def test_a_child_is_placed_in_its_cgroup_before_it_runs():
    child = Child.spawn("judge", env=ENV, gpu=False, label="test-children")
    try:
        if child._cgroup is None:
            pytest.skip("no cgroup can be made here")
        assert child.proc.pid in child._cgroup.pids()
    finally:
        child.discard()


def test_how_a_child_ended_is_reported():
    child = Child.spawn("judge", env=ENV, gpu=False, label="test-children")
    try:
        with pytest.raises(ChildError, match="exit code 3"):
            child.call(Setup(device="cpu", out_dir=child.path("/job/ref"), task_code="import os\nos._exit(3)\n"), None, 60)
        assert child.proc.poll() == 3
    finally:
        child.discard()
    killed = Child.spawn("judge", env=ENV, gpu=False, label="test-children")
    killed.kill()
    assert killed.proc.poll() == -9
    killed.discard()


def test_a_child_that_cannot_be_set_up_is_a_clear_error():
    zygote = forkserver.zygote_for(ENV, gpu=False)
    folder = zygote.jobs / "test-no-such-target"
    folder.mkdir()
    try:
        with pytest.raises(ChildError, match="could not be started.*/job/nowhere"):
            Child("judge", zygote, folder, dirs={"/job/nowhere": True}, env=ENV)
    finally:
        shutil.rmtree(folder)


def test_a_dead_fork_server_is_started_again():
    zygote = forkserver.zygote_for(ENV, gpu=False)
    zygote.proc.kill()
    zygote.proc.wait()
    facts = probe("""facts["pid"] = os.getpid()""")
    assert facts == {"pid": 1}
    assert forkserver.zygote_for(ENV, gpu=False) is not zygote
