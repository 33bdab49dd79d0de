"""The sandboxes under attack: real bubblewrap, real containers, real processes, real host checks.

Every test that takes ``sandbox`` or ``make_sandbox`` runs once per backend (``local``, ``docker``).
Each attack is contained, gives a clear result, and leaves the session usable. Where this host
cannot enforce a limit (no bubblewrap, no cgroup, no Docker engine), the test is skipped with a
reason that starts with "NOT ENFORCED ON THIS HOST" and says exactly what does not hold.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from support import TINY_TASK, memory_limit_skip_reason, process_limit_skip_reason

from kernel_env.sandbox.base import SandboxError
from kernel_env.sandbox.bwrap import python_executable
from kernel_env.sandbox.limits import Limits

# ----------------------------------------------------------------------------- helpers


def _pid_namespace(sandbox) -> str:
    """The sandbox's pid namespace as the host names it (namespace inodes are global)."""
    return sandbox.exec("readlink /proc/self/ns/pid").output.strip()


def _host_processes_in(namespace: str) -> list[int]:
    """Live (not zombie: a dead process waiting for the host's init to reap it) host processes in a pid namespace."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace and not _is_zombie(entry):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _is_zombie(pid: str) -> bool:
    """True for a dead process not yet reaped by the host's init (and for one that is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _host_processes_running(marker: str) -> list[str]:
    """Command lines of host processes that mention ``marker``."""
    hits = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and not _is_zombie(entry):
                hits.append(f"{entry}: {cmdline.strip()}")
    return hits


def _wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _usable(sandbox) -> None:
    result = sandbox.exec("echo still-alive")
    assert (result.exit_code, result.output) == (0, "still-alive\n")


# ----------------------------------------------------------------------------- identity


def test_commands_run_as_an_unprivileged_user_in_the_workspace(sandbox):
    result = sandbox.exec("id -u; id -g; pwd; grep ^CapEff /proc/self/status")
    uid, gid, cwd, caps = result.output.split("\n")[:4]
    # uid 1000; the docker backend on a host that is not root runs as that (unprivileged) host user
    expected = "1000" if os.geteuid() == 0 or sandbox.uid == 1000 else str(os.geteuid())
    assert (uid, cwd) == (str(sandbox.uid), "/workspace") and uid == expected and uid != "0"
    assert gid != "0"
    assert caps.split()[1] == "0000000000000000"


def test_the_host_processes_are_invisible_and_unkillable(sandbox):
    result = sandbox.exec(f"kill -0 {os.getpid()}; ps -e -o pid= | wc -l")
    assert "No such process" in result.output
    assert int(result.output.strip().splitlines()[-1]) < 10


def test_agent_files_written_inside_appear_on_the_host(sandbox):
    assert sandbox.exec("echo '// kernel' > kernels/relu.cpp").ok
    sandbox.write_bytes("model_new.py", b"class ModelNew: ...\n")
    assert (sandbox.workspace.path / "kernels" / "relu.cpp").read_text() == "// kernel\n"
    assert (sandbox.workspace.path / "model_new.py").read_bytes() == b"class ModelNew: ...\n"


# ----------------------------------------------------------------------------- file-system attacks


def test_writing_outside_the_workspace_changes_nothing_on_the_host(sandbox, tmp_path):
    host_dir = tmp_path / "host_dir"
    host_dir.mkdir()
    venv = Path(sys.prefix)
    name = f"kernel_env_evil_{uuid.uuid4().hex[:8]}"
    host_targets = [Path("/usr") / name, Path("/etc") / name, venv / name, host_dir / name, sandbox.workspace.root / name]
    for target in [*host_targets, f"/workspace/../{name}"]:
        # Inside, /tmp is a private tmpfs: `mkdir -p` of a host /tmp path may "succeed" there, harmlessly.
        sandbox.exec(f"mkdir -p $(dirname {target}) 2>/dev/null; echo pwned > {target}")
    created = [str(t) for t in [*host_targets, Path("/") / name] if t.exists()]
    assert created == []
    assert list(host_dir.iterdir()) == []


def test_the_file_api_refuses_paths_outside_the_workspace(sandbox):
    for path in ("/etc/passwd", "../state/shell.sh", "/workspace/../etc/hosts", "kernels/../../evil"):
        with pytest.raises(SandboxError, match="outside the workspace /workspace"):
            sandbox.write_bytes(path, b"pwned")
        with pytest.raises(SandboxError, match="outside the workspace /workspace"):
            sandbox.read_bytes(path)
    with pytest.raises(SandboxError, match="must not contain '..'"):
        sandbox.glob("../*")


@pytest.mark.parametrize("command", [
    "echo pwned >> model.py", "truncate -s0 model.py", "rm -f model.py", "mv model.py m.py", "chmod u+w model.py",
    "ln -sf /dev/null model.py", "python3 -c \"open('model.py', 'w')\"",
    "echo 'exit 0' > utils/compile.sh", "touch utils/sitecustomize.py", "rm -rf utils", "mv utils u2",
    "cp /dev/null binding.cpp", "echo '#define REGISTER_BINDING(n, f)' > binding_registry.h", "rm -f SKILL.md",
])
def test_protected_files_cannot_be_changed_from_the_shell(sandbox, command):
    before = (sandbox.workspace.path / "model.py").read_bytes()
    result = sandbox.exec(command)
    assert result.exit_code != 0, result.output
    assert any(reason in result.output for reason in ("Read-only file system", "Device or resource busy", "Permission denied"))
    assert sandbox.workspace.tampered_files() == []
    assert (sandbox.workspace.path / "model.py").read_bytes() == before
    _usable(sandbox)


@pytest.mark.parametrize("path", ["model.py", "utils/compile.sh", "utils/new_helper.py", "/workspace/binding.cpp",
                                  "kernels/../binding_registry.h", "SKILL.md"])
def test_protected_files_cannot_be_changed_through_the_file_api(sandbox, path):
    with pytest.raises(SandboxError, match=r"is protected \(.* is read-only\); write your code in kernels/ and model_new.py"):
        sandbox.write_bytes(path, b"pwned")
    assert sandbox.workspace.tampered_files() == []


def test_a_symlink_into_a_protected_file_cannot_be_written_through(sandbox):
    assert sandbox.exec("ln -s ../model.py kernels/model_link.py && ln -s ../utils kernels/utils_link").ok
    with pytest.raises(SandboxError, match="is protected"):
        sandbox.write_bytes("kernels/model_link.py", b"pwned")
    with pytest.raises(SandboxError, match="is protected"):
        sandbox.write_bytes("kernels/utils_link/compile.sh", b"pwned")
    assert not sandbox.exec("echo pwned > kernels/model_link.py").ok
    assert sandbox.workspace.tampered_files() == []


def test_host_files_cannot_be_read_directly_or_through_symlinks(sandbox, tmp_path):
    token = uuid.uuid4().hex
    secrets = [tmp_path / "host_secret.txt", sandbox.workspace.root / "next_to_the_workspace.txt"]
    for secret in secrets:
        secret.write_text(token)
    for secret in [*map(str, secrets), "/etc/shadow"]:
        result = sandbox.exec(f"cat {secret}; ln -sf {secret} kernels/link && cat kernels/link; cat /workspace/../{Path(secret).name}")
        assert token not in result.output and "root:" not in result.output, f"{secret} leaked"
        assert "No such file or directory" in result.output
        with pytest.raises(SandboxError, match="outside the workspace"):
            sandbox.read_bytes("kernels/link")
        with pytest.raises(SandboxError, match="outside the workspace"):
            sandbox.read_bytes(secret)


def test_only_a_few_etc_files_are_visible(sandbox, backend):
    visible = set(sandbox.exec("ls -A /etc").output.split())
    allowed = {"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf",
               "mime.types", "ssl", "passwd", "group"}
    if backend == "docker":  # the engine always writes these; their contents are checked below
        allowed |= {"hostname", "hosts", "resolv.conf", "mtab"}
        assert sandbox.exec("cat /etc/resolv.conf").output == ""  # not the host's name servers
        assert sandbox.exec("cat /etc/hostname").output == "kernel-env\n"
        assert sandbox.exec("grep -v localhost /etc/hosts | grep -v ^ff0 | grep -v ^fe00").output == ""
    assert visible <= allowed
    passwd = sandbox.exec("cat /etc/passwd").output
    assert passwd.startswith(f"agent:x:{sandbox.uid}:") and "$" not in passwd


def test_read_only_binds_under_the_host_tmp_stay_visible(make_sandbox, tmp_path):
    """A venv in a checkout under /tmp (CI's fresh clone) must not vanish under the private /tmp."""
    tools = tmp_path / "toolchain"
    tools.mkdir()
    (tools / "hello.sh").write_text("echo hello from the toolchain\n")
    (tmp_path / "beside_the_toolchain.txt").write_text("not bound")
    sandbox = make_sandbox(extra_ro_binds=(str(tools),))
    assert sandbox.exec(f"bash {tools}/hello.sh").output == "hello from the toolchain\n"
    assert "Read-only file system" in sandbox.exec(f"touch {tools}/evil").output
    assert sandbox.exec(f"test -e {tmp_path}/beside_the_toolchain.txt").exit_code == 1  # the rest stays private
    sandbox.close()
    assert not (tools / "evil").exists()


def test_an_interpreter_started_by_a_path_through_other_folders_still_starts_sandboxes(make_sandbox, tmp_path, monkeypatch):
    """``../.venv/bin/python`` run from a subfolder makes sys.executable pass through that subfolder,
    which no sandbox binds: the sandbox must start the interpreter by a path it can reach."""
    detour = tmp_path / "some" / "subfolder"
    detour.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(detour) + "/" + os.path.relpath(sys.executable, detour))
    assert ".." in sys.executable and os.path.exists(sys.executable)
    assert ".." not in python_executable() and os.path.samefile(python_executable(), sys.executable)
    sandbox = make_sandbox()
    _usable(sandbox)
    assert sandbox.exec("python3 -c 'print(6 * 7)'").output == "42\n"
    sandbox.close()


# ----------------------------------------------------------------------------- network


def test_a_host_port_cannot_be_reached(sandbox):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        result = sandbox.exec(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"; "
            f"echo > /dev/tcp/127.0.0.1/{port}",
            timeout=20,
        )
        assert result.exit_code != 0
        assert "Connection refused" in result.output
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever arrived on the host side
    finally:
        server.close()


def test_the_network_is_off(sandbox):
    interfaces = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").output.split()
    assert interfaces == ["lo"]
    result = sandbox.exec("python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"", timeout=20)
    assert result.exit_code != 0 and "gaierror" in result.output


# ----------------------------------------------------------------------------- killing the sandbox


@pytest.mark.parametrize("attack", ["kill -9 $PPID", "kill -9 -1"])
def test_killing_the_shell_server_restarts_the_session_with_its_state(sandbox, attack):
    sandbox.exec("cd kernels && export EXPORTED=1 && PLAIN=2 && greet() { echo hello \"$1\"; }")
    result = sandbox.exec(attack)
    assert result.exit_code is None and "restarted" in result.note
    after = sandbox.exec("pwd; echo $EXPORTED $PLAIN; greet agent")
    assert after.output == "/workspace/kernels\n1 2\nhello agent\n"
    assert sandbox.restarts == 1


def test_a_link_planted_in_the_state_folder_is_replaced_not_followed_on_restart(sandbox, tmp_path):
    """The sandbox's passwd and group live in its (agent-writable) state folder and are rewritten by
    the host on every start: a link planted there must not turn that into a write to a host file."""
    victim = tmp_path / "host_file"
    victim.write_text("host content\n")
    planted = sandbox.exec(f"cd /run/kernel_env/state && for f in passwd group resolv.conf; do rm -f $f; ln -s {victim} $f; done; "
                           "ls -l passwd")
    assert f"-> {victim}" in planted.output, planted.output
    assert sandbox.exec("kill -9 $PPID").exit_code is None  # the restart rewrites the files
    assert sandbox.exec("head -1 /etc/passwd").output.startswith("agent:x:")
    assert victim.read_text() == "host content\n"


# ----------------------------------------------------------------------------- resource attacks


def test_a_driver_holding_more_than_1024_files_still_runs_and_closes_sandboxes(make_sandbox):
    """A driver with hundreds of episodes holds descriptors numbered past 1024, where select()
    refuses them: 256 episodes on an H100 failed to close their sandboxes so. The sandbox code
    waits with poll, and Episode.open raises the soft limit on open files to the hard one."""
    import resource

    from kernel_env.runtime.episode import allow_many_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        allow_many_open_files.cache_clear()
        allow_many_open_files()
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if hard != resource.RLIM_INFINITY and hard <= 1100:
            pytest.skip(f"this host's hard limit on open files is {hard}")
        assert raised == (hard if hard != resource.RLIM_INFINITY else 1 << 20), (raised, hard)
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        try:
            box = make_sandbox()
            assert box.exec("echo hi").output.strip() == "hi"
            box.close()  # waits for its processes to end: past fd 1024 too
        finally:
            for fd in held:
                os.close(fd)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        allow_many_open_files.cache_clear()


def test_a_fork_bomb_is_contained_and_the_session_survives(make_sandbox, backend):
    reason = process_limit_skip_reason(backend)
    if reason:
        pytest.skip(reason)
    limits = Limits(processes=128)
    sandbox = make_sandbox(limits=limits)
    namespace = _pid_namespace(sandbox)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(_host_processes_in(namespace)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=3)
    finally:
        drained = _wait_until(lambda: len(_host_processes_in(namespace)) <= 3, timeout=15)
        done.set()
        watcher.join()
    assert result.timed_out and result.exit_code is None
    assert 10 < peak[0] <= limits.processes, f"peak of {peak[0]} processes in the sandbox"
    assert drained, f"{len(_host_processes_in(namespace))} processes still in the sandbox after the timeout"
    _usable(sandbox)


def test_a_timed_out_command_is_killed_with_processes_it_put_in_groups_of_their_own(sandbox):
    """ninja runs each compiler in a process group of its own: a timed-out build must not leave them running."""
    result = sandbox.exec("python3 -c 'import os, time; os.setpgid(0, 0); time.sleep(300)' & sleep 300", timeout=2)
    assert result.timed_out
    left = sandbox.exec("ps -eo pid,pgid,args", timeout=10).output
    assert "time.sleep(300)" not in left and "sleep 300" not in left, left


def test_a_30_gb_allocation_fails_inside_and_the_session_survives(sandbox):
    result = sandbox.exec("python3 -c 'x = bytearray(30 * 2**30)'; echo exit=$?", timeout=60)
    assert "MemoryError" in result.output and "exit=1" in result.output
    _usable(sandbox)


def test_the_whole_sandbox_memory_cap_kills_a_process_that_touches_too_much(make_sandbox, backend):
    reason = memory_limit_skip_reason(backend)
    if reason:
        pytest.skip(reason)
    sandbox = make_sandbox(limits=Limits(memory_bytes=256 << 20))
    result = sandbox.exec("python3 -c 'x = b\"x\" * (600 << 20); print(\"SUR\" + \"VIVED\")'; echo exit=$?", timeout=60)
    assert "SURVIVED" not in result.output
    assert "exit=137" in result.output or "MemoryError" in result.output, result.output
    _usable(sandbox)


@pytest.mark.parametrize("command", ["sleep 1000", "while :; do :; done", "trap '' TERM INT HUP; sleep 1000"])
def test_an_endless_command_times_out_and_the_session_keeps_its_state(sandbox, command):
    sandbox.exec("STATE=before")
    result = sandbox.exec(f"STATE=during; {command}", timeout=1)
    assert result.timed_out and result.exit_code is None
    assert 1 <= result.duration_s < 5
    assert sandbox.exec("echo $STATE").output == "before\n"


def test_100_mb_of_output_is_truncated_with_a_marker_and_fast(sandbox):
    result = sandbox.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo; echo THE-END", timeout=60, max_output=30_000)
    assert result.ok and result.truncated
    assert result.output_bytes == 100_000_000 + len("\nTHE-END\n")
    assert "bytes of output truncated ...]" in result.output
    assert len(result.output) < 30_000 + 100
    assert result.output.startswith("aaaa") and result.output.endswith("THE-END\n")
    assert result.duration_s < 10


def test_nothing_keeps_running_after_close(make_sandbox):
    sandbox = make_sandbox()
    marker = f"{1000 + uuid.uuid4().int % 1000}.{os.getpid()}"
    escapes = [
        f"sleep {marker} &",                        # a plain background job
        f"setsid sleep {marker} &",                 # a new session: outside the command's process group
        f"nohup sleep {marker} >/dev/null 2>&1 &",  # ignores SIGHUP
        f"(sleep {marker} &) &",                    # double fork: reparented to the sandbox's init
    ]
    for command in escapes:
        assert sandbox.exec(command).ok
    sandbox.start_background(f"sleep {marker}")
    assert _wait_until(lambda: len(_host_processes_running(f"sleep {marker}")) == 5, timeout=5), \
        _host_processes_running(f"sleep {marker}")
    namespace = _pid_namespace(sandbox)

    sandbox.close()

    assert _wait_until(lambda: not _host_processes_running(f"sleep {marker}"), timeout=5), \
        f"still running after close(): {_host_processes_running(f'sleep {marker}')}"
    assert _host_processes_in(namespace) == []
    sandbox.close()  # idempotent


# ----------------------------------------------------------------------------- the shell session


def test_the_shell_session_keeps_cwd_variables_functions_and_aliases(sandbox):
    sandbox.exec("cd kernels")
    sandbox.exec("export EXPORTED='a b'; PLAIN=42; LIST=(x y z)")
    sandbox.exec("twice() { echo \"$1$1\"; }; alias ll='echo aliased'")
    sandbox.exec("false")  # a failing command keeps the state too
    result = sandbox.exec("pwd; echo \"$EXPORTED\" $PLAIN ${LIST[2]}; twice ab; ll; python3 -c 'import os; print(os.environ[\"EXPORTED\"])'")
    assert result.output == "/workspace/kernels\na b 42 z\nabab\naliased\na b\n"


def test_two_sandboxes_do_not_share_shell_state_or_tmp(make_sandbox):
    first, second = make_sandbox(), make_sandbox()
    name = f"kernel_env_private_{uuid.uuid4().hex}"
    assert first.exec(f"echo mine > /tmp/{name}; export ONLY_FIRST=1").ok
    assert second.exec(f"test -e /tmp/{name}").exit_code == 1
    assert second.exec("echo \"[$ONLY_FIRST]\"").output == "[]\n"
    assert first.exec(f"cat /tmp/{name}").output == "mine\n"
    assert not Path(f"/tmp/{name}").exists()


def test_background_jobs_stream_output_and_report_their_exit(sandbox):
    sandbox.exec("cd kernels; export GREETING=hi")
    job = sandbox.start_background("pwd; echo $GREETING; for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 3")
    looks = []

    def finished() -> bool:
        looks.append(sandbox.background_output(job))
        return not looks[-1].running

    assert _wait_until(finished, timeout=10)
    assert "".join(look.new_output for look in looks) == "/workspace/kernels\nhi\nline 1\nline 2\nline 3\n"
    assert sum(1 for look in looks if look.new_output) >= 2, "the output came all at once, not as it was written"
    assert looks[-1].exit_code == 3
    assert sandbox.background_output(job).new_output == ""


def test_a_background_job_can_be_killed(sandbox):
    job = sandbox.start_background("echo started; sleep 1000")
    assert _wait_until(lambda: "started" in sandbox.background_output(job).new_output, timeout=5)
    killed = sandbox.kill_background(job)
    assert not killed.running and killed.exit_code == -9
    _usable(sandbox)


def test_an_unknown_background_job_is_a_clear_error(sandbox):
    job = sandbox.start_background("true")
    with pytest.raises(SandboxError, match=rf"no background job 'bash_99' \(known: {job}\)"):
        sandbox.background_output("bash_99")


def test_a_person_gets_the_same_sandbox_interactively(sandbox):
    """``kernel-env run-task`` runs interactive_argv with the terminal; here its stdin is a pipe."""
    result = subprocess.run(sandbox.interactive_argv(), input="id -u; pwd; echo x >> model.py; exit 0\n",
                            capture_output=True, text=True, timeout=30)
    assert result.stdout.split() == [str(sandbox.uid), "/workspace"]
    assert "model.py: Read-only file system" in result.stderr or "model.py: Permission denied" in result.stderr


# ----------------------------------------------------------------------------- without bubblewrap
# About the local backend only: how it behaves where bubblewrap cannot run.


_UNISOLATED = textwrap.dedent(
    """
    import sys
    from kernel_env.sandbox.base import SandboxError
    from kernel_env.sandbox.local import LocalSandbox
    from kernel_env.tasks import Task
    from kernel_env.workspace import Workspace

    task = Task(id="test/unisolated", code=open(sys.argv[1]).read())
    ws = Workspace.create(task, "cpp", root=sys.argv[2])
    try:
        LocalSandbox(ws, require_isolation=True)
    except SandboxError as exc:
        print("REFUSED:", exc)
    for _ in range(2):
        with LocalSandbox(ws) as sandbox:
            print("ISOLATED:", sandbox.isolated)
            print("RAN:", sandbox.exec("echo ran; pwd").output.split())
    ws.destroy()
    """
)


def test_without_bubblewrap_the_sandbox_says_so_loudly_once_and_still_runs(tmp_path):
    task_file = tmp_path / "task.py"
    task_file.write_text(TINY_TASK)
    # A PATH without bwrap on it: what a host without bubblewrap looks like to kernel_env.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run([sys.executable, "-c", _UNISOLATED, str(task_file), str(tmp_path / "ws")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "REFUSED: isolation required but bubblewrap (bwrap) is not installed" in result.stdout
    assert result.stderr.count("SANDBOX NOT ISOLATED: bubblewrap (bwrap) is not installed") == 1
    assert result.stdout.count("ISOLATED: False") == 2
    assert result.stdout.count("RAN: ['ran',") == 2


def test_a_look_at_a_background_job_loses_nothing_written_while_it_reads(tmp_path, monkeypatch):
    """The server's look at a job's log, raced by a writer: every byte shows up exactly once."""
    from kernel_env.sandbox import server

    log_path = tmp_path / "bash_1.log"
    log_path.write_bytes(b"")
    lines = [f"line {i}\n".encode() for i in range(20_000)]
    monkeypatch.setitem(server._jobs, "bash_1", {"proc": subprocess.Popen(["sleep", "60"]), "log": str(log_path),
                                                 "offset": 0, "command": "writer"})

    def write():
        with open(log_path, "ab", buffering=0) as log:
            for line in lines:
                log.write(line)

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    try:
        while writer.is_alive():
            seen.append(server.op_bg_output({"job_id": "bash_1", "max_output": 1 << 20})["new_output"])
        writer.join()
        seen.append(server.op_bg_output({"job_id": "bash_1", "max_output": 1 << 20})["new_output"])
    finally:
        server._jobs["bash_1"]["proc"].kill()
        server._jobs["bash_1"]["proc"].wait()
    assert sum(1 for look in seen if look) > 2, "the writer finished before the looks raced it"
    assert "".join(seen) == b"".join(lines).decode()
