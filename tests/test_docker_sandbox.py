"""What only the docker backend has: its container's settings, its labels, the reaper, image builds.

The attacks every backend must withstand are in test_sandbox.py (run against docker too); these
check the container itself, as the Engine reports it, and what happens to it when its owner dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support import TINY_TASK


pytestmark = pytest.mark.usefixtures("docker_engine")  # skipped only where no Docker engine answers


@pytest.fixture
def docker_sandbox(make_workspace):
    from kernel_env.sandbox.docker import DockerSandbox
    from kernel_env.sandbox.limits import Limits

    sandbox = DockerSandbox(make_workspace(), limits=Limits(processes=200, memory_bytes=1 << 30), cpus=1.5)
    sandbox.start()
    yield sandbox
    sandbox.close()


def _container(container_id: str) -> dict | None:
    import docker

    from kernel_env.sandbox.docker import engine

    try:
        return engine().api.inspect_container(container_id)
    except docker.errors.NotFound:
        return None


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_the_container_is_offline_unprivileged_read_only_and_capped(docker_sandbox):
    info = _container(docker_sandbox.container_id)
    host, config = info["HostConfig"], info["Config"]
    assert host["NetworkMode"] == "none"
    assert config["User"] == f"{docker_sandbox.uid}:{docker_sandbox.gid}" and docker_sandbox.uid != 0
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert (host["PidsLimit"], host["Memory"], host["MemorySwap"], host["NanoCpus"]) == (200, 1 << 30, 1 << 30, 1_500_000_000)
    assert not host["Privileged"] and not host.get("Devices") and not host.get("PortBindings")
    assert not any(key.startswith(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "NO_PROXY")) for key in config["Env"])
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/workspace"]["RW"] is True and mounts["/workspace/model.py"]["RW"] is False
    assert all(not m["RW"] for dest, m in mounts.items() if dest not in ("/workspace", "/run/kernel_env/state"))
    # ...and from inside: no interface but loopback, and the root file system refuses writes
    assert docker_sandbox.exec("ls /sys/class/net").output.split() == ["lo"]
    result = docker_sandbox.exec("touch /evil; touch /usr/evil; touch /etc/evil")
    assert result.output.count("Read-only file system") == 3, result.output


def test_the_agents_files_are_its_own_and_the_protected_ones_stay_the_hosts(docker_sandbox):
    ws = docker_sandbox.workspace.path
    assert docker_sandbox.exec("echo k > kernels/a.cu && echo m > model_new.py && mkdir build && touch build/x").ok
    for name in ("kernels/a.cu", "model_new.py", "build/x", "kernels", "."):
        assert (ws / name).stat().st_uid == docker_sandbox.uid, name
    for name in ("model.py", "utils/compile.sh", "binding.cpp", "SKILL.md"):
        info = (ws / name).stat()
        assert info.st_uid == os.geteuid() and not info.st_mode & 0o222, name


def test_the_container_is_labelled_with_its_owner_and_workspace(docker_sandbox):
    from kernel_env.sandbox.docker import LABEL, OWNER_LABEL, WORKSPACE_LABEL, _owner

    labels = _container(docker_sandbox.container_id)["Config"]["Labels"]
    assert labels[LABEL] == "1" and labels[OWNER_LABEL] == _owner()
    assert labels[WORKSPACE_LABEL] == str(docker_sandbox.workspace.path)


def test_close_removes_the_container(docker_sandbox):
    container_id = docker_sandbox.container_id
    assert _container(container_id)["State"]["Running"]
    docker_sandbox.close()
    assert _container(container_id) is None
    assert docker_sandbox.container_id is None
    docker_sandbox.close()  # idempotent


def test_the_reaper_removes_containers_whose_owner_died_and_keeps_the_others():
    from kernel_env.sandbox.docker import LABEL, OWNER_LABEL, _machine, _owner, engine, host_toolchain_image, reap

    # a real process that has ended: its pid and start time, as a sandbox's owner label records them
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.getpid(), open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])"],
                           capture_output=True, text=True, check=True)
    dead_pid, dead_start = probe.stdout.split()
    owners = {
        "dead": f"{_machine()}/{dead_pid}/{dead_start}",
        "alive": _owner(),
        "elsewhere": f"another-boot/4026531836/{dead_pid}/{dead_start}",  # cannot be judged from here: kept
    }
    api = engine().api
    created = {}
    try:
        for name, owner in owners.items():
            created[name] = api.create_container(
                host_toolchain_image(), command=["/bin/sleep", "300"], labels={LABEL: "1", OWNER_LABEL: owner},
                host_config=api.create_host_config(network_mode="none", read_only=True, mounts=_usr_mount()))["Id"]
            api.start(created[name])
        removed = reap()
        assert created["dead"] in removed
        assert _container(created["dead"]) is None
        assert _container(created["alive"]) is not None and _container(created["elsewhere"]) is not None
    finally:
        for container_id in created.values():
            if _container(container_id):
                api.remove_container(container_id, force=True)


def _usr_mount():
    from docker.types import Mount

    from kernel_env.sandbox.bwrap import toolchain_tops

    return [Mount(path, path, type="bind", read_only=True) for path, target in toolchain_tops() if target is None]


_OWNER = textwrap.dedent(
    """
    import sys, time
    from kernel_env.sandbox.docker import DockerSandbox
    from kernel_env.tasks import Task
    from kernel_env.workspace import Workspace

    ws = Workspace.create(Task(id="test/owner_dies", code=open(sys.argv[1]).read()), "cpp", root=sys.argv[2])
    sandbox = DockerSandbox(ws)
    sandbox.start()
    sandbox.start_background("sleep 600")
    sandbox.exec("setsid nohup sleep 600 >/dev/null 2>&1 &")
    print(sandbox.container_id, flush=True)
    time.sleep(600)
    """
)


def test_a_container_goes_when_its_owner_process_is_killed(tmp_path):
    """No close(), no reaper: the owner is SIGKILLed, and its container (with every process in it) goes by itself."""
    (tmp_path / "task.py").write_text(TINY_TASK)
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path / "task.py"), str(tmp_path / "ws")],
                             stdout=subprocess.PIPE, text=True)
    try:
        container_id = owner.stdout.readline().strip()
        assert container_id and _container(container_id)["State"]["Running"]
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert _wait_until(lambda: _container(container_id) is None, timeout=20), "the container outlived its owner"


def test_image_build_says_clearly_when_the_base_image_cannot_be_pulled():
    from typer.testing import CliRunner

    from kernel_env.cli import app

    # a registry address that refuses at once: no network needed, and no real image is ever built
    result = CliRunner().invoke(app, ["image", "build", "cpu", "--base", "127.0.0.1:9/kernel-env-test/none:never",
                                      "--tag", "kernel_env/test-never-built:x"])
    assert result.exit_code == 2, result.output
    assert "cannot pull the base image 127.0.0.1:9/kernel-env-test/none:never" in result.output


def test_a_named_image_that_is_not_here_is_a_clear_error(make_workspace):
    from kernel_env.sandbox.base import SandboxError
    from kernel_env.sandbox.docker import DockerSandbox

    sandbox = DockerSandbox(make_workspace(), image="kernel_env/not-built-here:never")
    with pytest.raises(SandboxError, match=r"docker image 'kernel_env/not-built-here:never' is not on this machine; "
                                           r"build it with `kernel-env image build`"):
        sandbox.start()
    sandbox.close()


def test_a_named_image_brings_its_own_toolchain_and_etc(make_workspace):
    """With ``image=``, nothing of the host's toolchain is bound (here the image is the empty host-toolchain
    image and only what the test binds makes it usable: a stand-in for an image of sandbox_images/)."""
    from kernel_env.sandbox.bwrap import python_prefixes, toolchain_tops
    from kernel_env.sandbox.docker import DockerSandbox, host_toolchain_image

    usr = tuple(path for path, target in toolchain_tops() if target is None)
    with DockerSandbox(make_workspace(), image=host_toolchain_image(), python=sys.executable,
                       extra_ro_binds=(*usr, *python_prefixes())) as sandbox:
        result = sandbox.exec("ls /etc; echo $PATH; test -e /etc/ld.so.cache || echo no-host-etc")
        assert sorted(result.output.split("\n")[0:4]) == ["hostname", "hosts", "mtab", "resolv.conf"]
        assert "no-host-etc" in result.output
        assert result.output.split("\n")[4].split(":")[:2] == ["/run/kernel_env/bin", os.path.dirname(sys.executable)]
        assert sandbox.exec("echo k > kernels/a.cu && cat kernels/a.cu").output == "k\n"
