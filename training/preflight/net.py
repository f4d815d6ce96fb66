"""Network checks of the doctor: socket interfaces, the rendezvous master, the hostfile's nodes.

Every probe is bounded (name resolution, TCP connect, ssh), so a wrong ``MASTER_ADDR`` is reported in seconds with
the cause spelled out: the name does not resolve, the address is not on this host and nothing answers, or the host
answers but nothing listens on ``MASTER_PORT``.
"""

from __future__ import annotations

import concurrent.futures as cf
import errno
import ipaddress
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from training.preflight.base import CheckResult, DoctorConfig, Status

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-o", "StrictHostKeyChecking=accept-new")


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: int


def parse_hostfile(text: str) -> list[HostSlots]:
    """DeepSpeed hostfile lines ``host slots=N``; ``#`` starts a comment. Raises ValueError naming the bad line."""
    hosts: list[HostSlots] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ValueError(f"hostfile line {lineno} {raw.strip()!r}: expected 'HOSTNAME slots=N'")
        if any(h.host == parts[0] for h in hosts):
            raise ValueError(f"hostfile line {lineno}: host {parts[0]!r} listed twice")
        hosts.append(HostSlots(parts[0], int(parts[1][6:])))
    if not hosts:
        raise ValueError("hostfile lists no hosts")
    return hosts


def resolve(name: str, timeout_s: float) -> tuple[str | None, str]:
    """(ip, "") or (None, reason). getaddrinfo cannot be cancelled, so it runs in a thread we stop waiting for."""
    pool = cf.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(socket.getaddrinfo, name, None, 0, socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout_s)
    except cf.TimeoutError:
        return None, f"name resolution took longer than {timeout_s:g} s (DNS unreachable?)"
    except socket.gaierror as exc:
        return None, exc.strerror or str(exc)
    except UnicodeError as exc:  # e.g. a label longer than 63 characters
        return None, str(exc)
    finally:
        pool.shutdown(wait=False)
    v4 = [str(i[4][0]) for i in infos if i[0] == socket.AF_INET]
    return (v4 or [str(infos[0][4][0])])[0], ""


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET


def is_local_address(ip: str) -> bool:
    """True when ``ip`` is assigned to this host (binding to it succeeds)."""
    with socket.socket(_family(ip), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))
        except OSError:
            return False
    return True


def port_free(ip: str, port: int) -> bool:
    """Can a rendezvous server bind here? SO_REUSEADDR like c10d's TCPStore, so TIME_WAIT does not count."""
    with socket.socket(_family(ip), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def tcp_probe(ip: str, port: int, timeout_s: float) -> tuple[str, str]:
    """Connect once: ("open"|"refused"|"unreachable"|"timeout", detail)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            return "open", ""
    except ConnectionRefusedError:
        return "refused", "connection refused"
    except TimeoutError:
        return "timeout", f"no answer within {timeout_s:g} s"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL):
            return "unreachable", os.strerror(exc.errno or 0)
        return "unreachable", str(exc)


def check_master(cfg: DoctorConfig) -> list[CheckResult]:
    """MASTER_ADDR resolves; if it is this host, MASTER_PORT can be bound; else the host answers on the port."""
    addr, port = cfg.master_addr, cfg.master_port
    if not addr:
        return [
            CheckResult(
                "master",
                Status.WARN,
                "MASTER_ADDR is not set (single-node launchers use 127.0.0.1)",
                "for multi-node: export MASTER_ADDR=<IP of the rank-0 node reachable from every node> "
                "(source infra/launch/env.sh)",
            )
        ]
    ip, why = resolve(addr, cfg.connect_timeout_s)
    if ip is None:
        return [
            CheckResult(
                "master",
                Status.FAIL,
                f"cannot resolve MASTER_ADDR {addr!r}: {why}",
                "use the master's IP address, or add '<ip> " + addr + "' to /etc/hosts on every node "
                "(or fix DNS); check for typos",
                {"master_addr": addr},
            )
        ]
    data = {"master_addr": addr, "ip": ip, "port": port}
    if is_local_address(ip):
        return [_check_local_master(cfg, addr, ip, data)]
    state, detail = tcp_probe(ip, port, cfg.connect_timeout_s)
    data["probe"] = state
    where = f"MASTER_ADDR {addr} ({ip})" if ip != addr else f"MASTER_ADDR {addr}"
    if state == "open":
        return [
            CheckResult("master", Status.PASS, f"{where} is reachable and port {port} is open", data=data)
        ]
    if state == "refused":
        return [
            CheckResult(
                "master",
                Status.FAIL if cfg.expect_master else Status.WARN,
                f"{where} answers but port {port} is closed (connection refused): nothing listens there"
                + (" although the master should be running" if cfg.expect_master else " yet"),
                "start rank 0 first; check that MASTER_PORT is the same on every node and that the "
                "master's firewall allows it",
                data,
            )
        ]
    return [
        CheckResult(
            "master",
            Status.FAIL,
            f"{where} is not an address of this host and is unreachable ({detail})",
            "check the address (`ip addr` on the master), the route and firewall between "
            "the nodes, and NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME",
            data,
        )
    ]


def _check_local_master(cfg: DoctorConfig, addr: str, ip: str, data: dict) -> CheckResult:
    port = cfg.master_port
    data["local"] = True
    if ipaddress.ip_address(ip).is_loopback and _hostfile_nodes(cfg) > 1:
        return CheckResult(
            "master",
            Status.FAIL,
            f"MASTER_ADDR {addr} is a loopback address but the hostfile lists {_hostfile_nodes(cfg)} nodes",
            "set MASTER_ADDR to this node's address on the network the other nodes use",
            data,
        )
    if port_free(ip, port):
        if cfg.expect_master:
            return CheckResult(
                "master",
                Status.FAIL,
                f"MASTER_ADDR {addr} is this host but nothing listens on port {port}",
                "start rank 0 (the rendezvous server) first",
                data,
            )
        return CheckResult(
            "master",
            Status.PASS,
            f"MASTER_ADDR {addr} ({ip}) is this host; port {port} is free for the rendezvous",
            data=data,
        )
    listening = tcp_probe(ip, port, cfg.connect_timeout_s)[0] == "open"
    if cfg.expect_master and listening:
        return CheckResult(
            "master",
            Status.PASS,
            f"MASTER_ADDR {addr} is this host; the rendezvous on port {port} is listening",
            data=data,
        )
    return CheckResult(
        "master",
        Status.FAIL,
        f"MASTER_ADDR {addr} is this host but port {port} is already in use",
        "pick another MASTER_PORT (e.g. 29501) or stop the process holding it (`ss -ltnp`); if it is your "
        "running job's rendezvous, pass --expect-master",
        data,
    )


def _hostfile_nodes(cfg: DoctorConfig) -> int:
    if not cfg.hostfile:
        return 1
    try:
        return len(parse_hostfile(Path(cfg.hostfile).read_text()))
    except (OSError, ValueError):
        return 1


def _ssh_ok(host: str, timeout_s: float) -> tuple[bool, str]:
    cmd = ["ssh", *SSH_OPTIONS, host, "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 10)
    except subprocess.TimeoutExpired:
        return False, f"ssh did not finish within {timeout_s + 10:g} s"
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode == 0, last or f"ssh exit status {proc.returncode}"


def _check_node(node: HostSlots, cfg: DoctorConfig) -> CheckResult:
    name = f"hostfile:{node.host}"
    ip, why = resolve(node.host, cfg.connect_timeout_s)
    if ip is None:
        return CheckResult(
            name,
            Status.FAIL,
            f"cannot resolve {node.host!r}: {why}",
            f"add '<ip> {node.host}' to /etc/hosts on every node, or use IP addresses",
        )
    ok, detail = _ssh_ok(node.host, cfg.connect_timeout_s)
    if not ok:
        return CheckResult(
            name,
            Status.FAIL,
            f"{node.host} ({ip}): passwordless ssh failed: {detail}",
            f"ssh-copy-id {node.host} from this node, accept its host key once (`ssh {node.host} "
            "true`), and check sshd runs there",
            {"ip": ip, "slots": node.slots},
        )
    return CheckResult(
        name,
        Status.PASS,
        f"{node.host} ({ip}) resolves and accepts passwordless ssh, {node.slots} slot(s)",
        data={"ip": ip, "slots": node.slots},
    )


def check_hostfile(cfg: DoctorConfig) -> list[CheckResult]:
    """Every node resolves and accepts ``ssh -o BatchMode=yes host true`` (what pdsh needs), checked in parallel."""
    if not cfg.hostfile:
        return []
    try:
        nodes = parse_hostfile(Path(cfg.hostfile).read_text())
    except (OSError, ValueError) as exc:
        return [CheckResult("hostfile", Status.FAIL, f"{cfg.hostfile}: {exc}", "see infra/hostfile.example")]
    results = []
    if not shutil.which("ssh"):
        return [
            CheckResult("hostfile", Status.FAIL, "ssh is not installed", "apt-get install openssh-client")
        ]
    if len(nodes) > 1 and not shutil.which("pdsh"):
        results.append(
            CheckResult(
                "hostfile",
                Status.WARN,
                "pdsh is not installed (DeepSpeed's default multi-node launcher)",
                "apt-get install pdsh, or launch with infra/launch/torchrun_node.sh",
            )
        )
    with cf.ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        results.extend(pool.map(lambda n: _check_node(n, cfg), nodes))
    return results


def _matches(spec: str, names: list[str], exact_default: bool) -> list[str]:
    """Interfaces selected by an NCCL-style spec: ``eth`` prefix, ``=eth0`` exact, ``^docker`` exclusion."""
    exclude = spec.startswith("^")
    body = spec.lstrip("^")
    exact = exact_default or body.startswith("=")
    wanted = [w for w in body.lstrip("=").split(",") if w]
    hit = [n for n in names if any(n == w if exact else n.startswith(w) for w in wanted)]
    return [n for n in names if n not in hit] if exclude else hit


def check_interfaces(cfg: DoctorConfig) -> list[CheckResult]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select existing interfaces; IB present but disabled is noted."""
    names = [n for _, n in socket.if_nameindex()]
    results = []
    for var, exact in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        spec = cfg.env.get(var)
        if not spec:
            continue
        picked = _matches(spec, names, exact)
        if picked:
            results.append(
                CheckResult(f"network:{var}", Status.PASS, f"{var}={spec} selects {', '.join(picked)}")
            )
        else:
            results.append(
                CheckResult(
                    f"network:{var}",
                    Status.FAIL,
                    f"{var}={spec} matches no interface of this host ({', '.join(names)})",
                    f"set {var} to the interface that carries the inter-node traffic (see `ip -br addr`)",
                )
            )
    ib = Path("/sys/class/infiniband")
    if cfg.env.get("NCCL_IB_DISABLE") == "1" and ib.is_dir() and any(ib.iterdir()):
        results.append(
            CheckResult(
                "network:NCCL_IB_DISABLE",
                Status.WARN,
                "InfiniBand devices exist but NCCL_IB_DISABLE=1 sends NCCL over TCP sockets",
                "unset NCCL_IB_DISABLE unless IB is broken on this cluster",
            )
        )
    if not results:
        results.append(
            CheckResult(
                "network",
                Status.PASS,
                f"interfaces: {', '.join(names)}; NCCL/gloo choose automatically",
                data={"interfaces": names},
            )
        )
    return results
