"""Real Flower processes for the deployment tests: a SuperLink and SuperNodes on free 127.0.0.1 ports.

Shared by tests/federated/test_flower.py and tests/federated/test_flower_secure.py. Every process started
here runs in its own process group and :meth:`Deployment.close` kills it and all its descendants.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(d.name))
    return tree


def _tree(pid: int) -> set[int]:
    """``pid`` and all its descendants (SuperExec, flwr-serverapp, flwr-clientapp processes)."""
    tree, out, todo = _children(), set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(tree.get(p, []))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Deployment:
    """A SuperLink and SuperNodes on free 127.0.0.1 ports, each in its own process group."""

    def __init__(self, root: Path):
        self.root = root
        self.link_port = _free_port()
        home = root / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{self.link_port}"\ninsecure = true\n')
        # Flower's processes start helpers (flower-superexec, flwr-clientapp) from PATH: put the
        # interpreter's bin first, as an activated venv would (CI runs .venv/bin/python unactivated)
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(home),
                    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.pids: set[int] = set()

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "a")
        p = subprocess.Popen([str(BIN / args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True, cwd=self.root)
        log.close()
        self.procs[name] = p
        return p

    def start_link(self) -> None:
        self.start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                                 "--host", "127.0.0.1", "--port", str(self.link_port)])
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.link_port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.procs["superlink"].poll() is not None:
                    raise RuntimeError("the SuperLink did not start:\n" + self.log("superlink")) from None
                time.sleep(0.2)

    def start_node(self, i: int, node_config: str) -> None:
        self.start(f"node{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.link_port}",
                                "--port", str(_free_port()), "--node-config", node_config])

    def kill(self, name: str) -> set[int]:
        """SIGKILL ``name``'s process group and every descendant; returns the pids killed."""
        p = self.procs.pop(name)
        pids = _tree(p.pid)
        self.pids |= pids
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for q in pids:  # SuperExec of the SuperLink runs in its own session
            try:
                os.kill(q, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        p.wait(timeout=30)
        return pids

    def flwr_run(self, app: Path, *extra: str, timeout: float = 240) -> str:
        r = subprocess.run([str(BIN / "flwr"), "run", str(app), "local", "--stream", *extra], env=self.env,
                           capture_output=True, text=True, timeout=timeout, cwd=self.root)
        return r.stdout + r.stderr

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]

    def close(self) -> list[int]:
        """Kill everything started here; returns the pids still alive 10 s later (should be none)."""
        for name in list(self.procs):
            self.kill(name)
        deadline = time.monotonic() + 10
        while (alive := [p for p in self.pids if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive


def _wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        time.sleep(0.2)
    return v




def two_sites(real_store, root: Path) -> list[Path]:
    """Two site folders ``root/site0``, ``root/site1`` (``site-0``, ``site-1``), each with its own store: an iid
    2-client partition of ``real_store``, each client's records one site's (the Flower scenarios' consortium)."""
    from fedhype.data.partition import make_partition
    from fedhype.data.sites import make_site

    part = make_partition(real_store, scheme="iid", n_clients=2, seed=0)
    sites = []
    for i, c in enumerate(part.clients):  # each site: its own store and its own split
        own = real_store.subset(real_store.positions(c.train + c.val + c.test))
        own.save(root / f"site{i}.safetensors")
        sites.append(make_site(own, root / f"site{i}.safetensors", f"site-{i}", seed=i).save(root / f"site{i}"))
    return sites
