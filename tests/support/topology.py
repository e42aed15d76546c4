"""Real Redis Cluster and Sentinel groups on loopback, and clients for any test URL.

``ClusterGroup``: six cluster-enabled redis-servers (3 masters, 3 replicas) joined by
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``; its URL is
``redis+cluster://127.0.0.1:PORT``. ``SentinelGroup``: a master, a replica and three
sentinels (``redis-server CONF --sentinel``, quorum 2); its URL is
``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/SERVICE``. Both are stopped
process by process (by the PIDs they started) in ``close()``, also after a failed start::

    with ClusterGroup(tmp_path / "cluster") as cluster:
        r = cluster.client()                         # a redis.cluster.RedisCluster
        cluster.kill_master_of("some-key")           # SIGKILL, then wait for a promotion

``client_for_url(url)`` turns any of the three URL kinds into a sync redis-py client
(``redis.Redis``, ``RedisCluster``, or Sentinel's master client) for fixtures and
assertions. Nothing here imports tidings.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.sentinel
from redis.cluster import RedisCluster

from .procs import Proc, free_port, spawn, wait_for
from .redis_server import RedisServer, RedisServerError, find_redis_server

__all__ = ["ClusterGroup", "SentinelGroup", "all_clients", "client_for_url", "find_redis_cli"]

SERVICE = "tidings-test"


def find_redis_cli() -> str:
    """``redis-cli`` beside the redis-server binary, else on PATH."""
    beside = Path(find_redis_server()).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-cli")
    if found:
        return found
    raise RedisServerError("redis-cli not found (apt-get install redis-tools)")


def client_for_url(url: str, **kwargs: Any) -> Any:
    """A sync client for a ``redis://``, ``redis+cluster://`` or ``redis+sentinel://`` URL."""
    if url.startswith("redis+cluster://"):
        return RedisCluster.from_url("redis://" + url[len("redis+cluster://") :], **kwargs)
    if url.startswith("redis+sentinel://"):
        rest = url[len("redis+sentinel://") :]
        hosts, _, path = rest.partition("/")
        sentinels = []
        for item in hosts.split(","):
            host, _, port = item.rpartition(":")
            sentinels.append((host, int(port)))
        service = path.split("/")[0]
        sentinel: Any = redis.sentinel.Sentinel(sentinels, socket_timeout=2.0)
        return sentinel.master_for(service, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port <= 55535 and _port_is_free(port + 10000):
            return port
    for port in range(20000 + (time.monotonic_ns() // 1000) % 20000, 55535, 7):
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RedisServerError("no free port pair for a cluster node")


def all_clients(r: Any) -> list[dict[str, Any]]:
    """CLIENT LIST of every node a client talks to (one server, or every cluster node)."""
    if isinstance(r, RedisCluster):
        out: list[dict[str, Any]] = []
        for node in r.get_nodes():
            out += node.redis_connection.client_list()
        return out
    return list(r.client_list())


class ClusterGroup:
    """Six cluster-enabled redis-servers, three masters with one replica each."""

    def __init__(self, data_dir: Path, *, node_timeout_ms: int = 1000, size: int = 6) -> None:
        self.data_dir = Path(data_dir)
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = [
            RedisServer(
                self.data_dir / f"node-{i}",
                port=cluster_port(),
                appendonly=False,
                extra_args=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                    # A failover promotes even a replica that lost its link a while ago.
                    "--cluster-replica-validity-factor",
                    "0",
                ],
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> ClusterGroup:
        try:
            for node in self.nodes:
                node.start()
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            out = subprocess.run(
                [find_redis_cli(), "--cluster", "create", *addrs,
                 "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                raise RedisServerError(
                    f"redis-cli --cluster create failed:\n{out.stdout}{out.stderr}"
                )
            self.wait_healthy(30)
        except BaseException:
            self.close()
            raise
        return self

    def _raw(self, node: RedisServer) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1.0)

    def _info(self, node: RedisServer, command: str) -> dict[str, str]:
        r = self._raw(node)
        try:
            raw = r.execute_command(command)
        finally:
            r.close()
        if isinstance(raw, dict):  # redis-py parses CLUSTER INFO itself
            return {str(k): str(v) for k, v in raw.items()}
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        lines = [x for x in text.splitlines() if ":" in x and not x.startswith("#")]
        return dict(x.split(":", 1) for x in lines)

    def healthy(self) -> bool:
        """Every running node sees all slots covered, and every replica is in sync."""
        try:
            masters = 0
            for node in self.nodes:
                if not node.running():
                    continue
                info = self._info(node, "CLUSTER INFO")
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
                repl = self._info(node, "INFO replication")
                if repl.get("role") == "master":
                    masters += 1
                elif repl.get("master_link_status") != "up":
                    return False
            return masters >= 3
        except redis.RedisError:
            return False

    def wait_healthy(self, timeout_s: float = 30) -> None:
        wait_for(self.healthy, timeout_s, 0.1, message="cluster state ok on every node")

    def client(self, **kwargs: Any) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kwargs)

    def node_of(self, key: str) -> RedisServer:
        """The master serving ``key`` now."""
        for node in self.nodes:
            if not node.running():
                continue
            r = self._raw(node)
            try:
                slot = int(r.execute_command("CLUSTER KEYSLOT", key))
                for entry in r.execute_command("CLUSTER SLOTS"):
                    if int(entry[0]) <= slot <= int(entry[1]):
                        port = int(entry[2][1])
                        return next(n for n in self.nodes if n.port == port)
            except redis.RedisError:
                continue
            finally:
                r.close()
        raise RedisServerError(f"no node serves {key!r}")

    def replica_of(self, master: RedisServer) -> RedisServer:
        for node in self.nodes:
            if node is master or not node.running():
                continue
            repl = self._info(node, "INFO replication")
            if repl.get("role") == "slave" and int(repl.get("master_port", 0)) == master.port:
                return node
        raise RedisServerError(f"no replica of {master!r}")

    def serves(self, key: str, node: RedisServer) -> bool:
        """``node`` is a primary and the cluster's slot map names it for ``key``."""
        try:
            role = self._info(node, "INFO replication").get("role")
            return role == "master" and self.node_of(key).port == node.port
        except (redis.RedisError, RedisServerError):
            return False

    def promoted(self, old: RedisServer, replica: RedisServer) -> bool:
        try:
            return self._info(replica, "INFO replication").get("role") == "master"
        except redis.RedisError:
            return False

    def kill_master_of(self, key: str) -> tuple[RedisServer, RedisServer, float]:
        """SIGKILL the master of ``key``; returns (old master, replica, seconds to promotion)."""
        master = self.node_of(key)
        replica = self.replica_of(master)
        t0 = time.monotonic()
        master.kill()
        wait_for(lambda: self.serves(key, replica), 30, 0.02, message="replica promoted")
        return master, replica, time.monotonic() - t0

    def failover_master_of(self, key: str) -> tuple[RedisServer, RedisServer, float]:
        """``CLUSTER FAILOVER`` on the replica of ``key``'s master; returns as above."""
        master = self.node_of(key)
        replica = self.replica_of(master)
        t0 = time.monotonic()
        r = self._raw(replica)
        try:
            r.execute_command("CLUSTER FAILOVER")
        finally:
            r.close()
        wait_for(lambda: self.serves(key, replica), 30, 0.02, message="replica promoted")
        return master, replica, time.monotonic() - t0

    def close(self) -> None:
        for node in self.nodes:
            try:
                node.close()
            except Exception:
                node.kill()

    def __enter__(self) -> ClusterGroup:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SentinelGroup:
    """A master, a replica and three sentinels (quorum 2) watching them as ``SERVICE``."""

    def __init__(
        self, data_dir: Path, *, down_after_ms: int = 1000, service: str = SERVICE
    ) -> None:
        self.data_dir = Path(data_dir)
        self.down_after_ms = down_after_ms
        self.service = service
        self.master = RedisServer(self.data_dir / "master", appendonly=False)
        self.replica: RedisServer | None = None
        self.sentinel_ports: list[int] = []
        self.sentinels: list[Proc] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [s for s in (self.master, self.replica) if s is not None]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self) -> SentinelGroup:
        try:
            self.master.start()
            self.replica = RedisServer(
                self.data_dir / "replica",
                appendonly=False,
                extra_args=["--replicaof", "127.0.0.1", str(self.master.port)],
            ).start()
            wait_for(self._replica_up, 15, 0.05, message="replica in sync")
            for i in range(3):
                port = free_port()
                d = self.data_dir / f"sentinel-{i}"
                d.mkdir(parents=True, exist_ok=True)
                conf = d / "sentinel.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} 5000\n"
                    f"sentinel parallel-syncs {self.service} 1\n"
                )
                proc = spawn(
                    [self.master.binary, str(conf), "--sentinel"],
                    log_path=d / "sentinel.log",
                    cwd=d,
                )
                self.sentinels.append(proc)
                self.sentinel_ports.append(port)
            wait_for(self._sentinels_ready, 30, 0.1, message="sentinels see replica and peers")
        except BaseException:
            self.close()
            raise
        return self

    def _replica_up(self) -> bool:
        assert self.replica is not None
        r = self.replica.client(socket_timeout=1.0)
        try:
            return r.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[i], socket_timeout=2.0)

    def _sentinels_ready(self) -> bool:
        for i in range(len(self.sentinel_ports)):
            s = self.sentinel_client(i)
            try:
                info = s.sentinel_master(self.service)
                if int(info.get("num-slaves", 0)) < 1:
                    return False
                if int(info.get("num-other-sentinels", 0)) < 2:
                    return False
            except redis.RedisError:
                return False
            finally:
                s.close()
        return True

    def current_master_port(self) -> int:
        s = self.sentinel_client()
        try:
            return int(s.sentinel_get_master_addr_by_name(self.service)[1])
        finally:
            s.close()

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def _promoted(self, old_port: int) -> bool:
        try:
            new = self.server_on(self.current_master_port())
            if new.port == old_port or not new.running():
                return False
            r = new.client(socket_timeout=1.0)
            try:
                return r.info("replication").get("role") == "master"
            finally:
                r.close()
        except (redis.RedisError, StopIteration):
            return False

    def kill_master(self) -> tuple[RedisServer, float]:
        """SIGKILL the master; returns (old master, seconds until one is promoted)."""
        old = self.server_on(self.current_master_port())
        t0 = time.monotonic()
        old.kill()
        wait_for(lambda: self._promoted(old.port), 30, 0.05, message="sentinel promoted")
        return old, time.monotonic() - t0

    def failover(self) -> tuple[RedisServer, float]:
        """``SENTINEL FAILOVER``; returns (old master, seconds until the switch)."""
        old = self.server_on(self.current_master_port())
        t0 = time.monotonic()
        s = self.sentinel_client()
        try:
            s.execute_command("SENTINEL FAILOVER", self.service)
        finally:
            s.close()
        wait_for(lambda: self._promoted(old.port), 30, 0.05, message="sentinel promoted")
        return old, time.monotonic() - t0

    def close(self) -> None:
        for proc in self.sentinels:
            if proc.alive():
                proc.kill()
        for server in self.servers:
            try:
                server.close()
            except Exception:
                server.kill()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
