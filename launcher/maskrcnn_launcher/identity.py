"""Who this pod is: role, index, and where the master is.

Order (first that answers wins):
1. explicit flags, then their environment variables (`--role`/MASKRCNN_ROLE, `--index`/MASKRCNN_INDEX,
   `--master-addr`/MASTER_ADDR, `--master-port`/MASTER_PORT): bare nodes, `docker run`;
2. Kubernetes: the StatefulSet pod name (POD_NAME, else HOSTNAME) `<prefix>-master-0` or
   `<prefix>-worker-<i>`; with POD_NAMESPACE, MASKRCNN_HEADLESS_SERVICE and MASKRCNN_CLUSTER_DOMAIN
   the master's address is `<prefix>-master-0.<service>.<namespace>.svc.<domain>`.
The master port defaults to the topology's `network.master_port`. The pod name's format is the
contract's (`contract.pod_name` / `contract.parse_pod_name`), shared with `status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import ROLES, parse_pod_name, pod_name
from maskrcnn_launcher.errors import IdentityError
from maskrcnn_launcher.topology import Topology

# The master needs no address for itself: rank 0 hosts the store and listens on every interface,
# so on a bare node without --master-addr it records loopback.
SELF_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class IdentityInputs:
    """Values given on the command line; None means "not given" (the environment may answer)."""

    role: str | None = None
    index: int | None = None
    master_addr: str | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class Cluster:
    """Names that make a pod's stable DNS name through the headless Service."""

    prefix: str
    service: str
    namespace: str
    domain: str = contract.DEFAULT_CLUSTER_DOMAIN

    def dns_name(self, role: str, index: int) -> str:
        return f"{pod_name(self.prefix, role, index)}.{self.service}.{self.namespace}.svc.{self.domain}"


@dataclass(frozen=True)
class Identity:
    role: str
    index: int
    master_addr: str
    master_port: int
    source: str  # how the role was found, for logs and error messages
    cluster: Cluster | None = None
    pod_ip: str | None = None

    @property
    def dns_name(self) -> str | None:
        return self.cluster.dns_name(self.role, self.index) if self.cluster else None


def resolve_identity(inputs: IdentityInputs, env: Mapping[str, str], topology: Topology) -> Identity:
    """Derive this pod's identity; raise `IdentityError` listing every problem."""
    errors: list[str] = []
    role = inputs.role or env.get(contract.ROLE) or None
    index = inputs.index if inputs.index is not None else _int_env(env, contract.INDEX, errors)

    name_var = contract.POD_NAME if env.get(contract.POD_NAME) else contract.HOSTNAME
    name = env.get(name_var, "")
    parsed = parse_pod_name(name) if name else None

    if role is not None:
        source = "flags/environment"
        if role not in ROLES:
            errors.append(f"role: {role!r} is not one of {', '.join(ROLES)} (--role / {contract.ROLE})")
        if index is None:
            if role == "worker":
                errors.append(f"index: a worker needs --index / {contract.INDEX} (its 0-based ordinal)")
            index = 0
    elif index is not None:
        errors.append(f"index: --index / {contract.INDEX} given without --role / {contract.ROLE}")
        source, role, index = "flags/environment", "worker", index
    elif parsed is not None:
        _, role, index = parsed
        source = f"{name_var}={name}"
    else:
        found = f"{name_var}={name!r} is not <prefix>-master-0 / <prefix>-worker-<i>" if name else "no pod name"
        raise IdentityError(
            f"identity: give --role/--index ({contract.ROLE}/{contract.INDEX}) or run in a StatefulSet pod "
            f"named <prefix>-master-0 / <prefix>-worker-<i> ({contract.POD_NAME} or {contract.HOSTNAME}); "
            f"{found}"
        )

    _check_range(role, index, topology, source, errors)
    cluster = _cluster(parsed, env)
    master_addr = inputs.master_addr or env.get(contract.MASTER_ADDR) or None
    if master_addr is None:
        if cluster is not None:
            master_addr = cluster.dns_name("master", 0)
        elif role == "master":
            master_addr = SELF_ADDR
        else:
            errors.append(_missing_master_addr(parsed, env))
            master_addr = ""
    port = inputs.master_port if inputs.master_port is not None else _int_env(env, contract.MASTER_PORT, errors)
    if port is None:
        port = topology.network.master_port
    elif not 1 <= port <= 65535:
        errors.append(f"master port: {port} is out of range 1..65535 (--master-port / {contract.MASTER_PORT})")
    if errors:
        raise IdentityError(errors)
    return Identity(role, index, master_addr, port, source, cluster, env.get(contract.POD_IP) or None)


def _check_range(role: str, index: int, topology: Topology, source: str, errors: list[str]) -> None:
    if role == "master" and index != 0:
        errors.append(f"index: the master is index 0, got {index} ({source})")
    if role == "worker" and not 0 <= index < len(topology.workers):
        count = len(topology.workers)
        errors.append(
            f"index: worker {index} is out of range: {topology.source} has {count} worker(s) "
            f"(indices 0..{count - 1}) ({source})"
        )


def _cluster(parsed: tuple[str, str, int] | None, env: Mapping[str, str]) -> Cluster | None:
    service = env.get(contract.HEADLESS_SERVICE)
    namespace = env.get(contract.POD_NAMESPACE)
    if parsed is None or not service or not namespace:
        return None
    domain = env.get(contract.CLUSTER_DOMAIN) or contract.DEFAULT_CLUSTER_DOMAIN
    return Cluster(parsed[0], service, namespace, domain)


def _missing_master_addr(parsed: tuple[str, str, int] | None, env: Mapping[str, str]) -> str:
    if parsed is None:
        return (
            f"master address: give --master-addr / {contract.MASTER_ADDR} (no StatefulSet pod name to derive it from)"
        )
    missing = [v for v in (contract.HEADLESS_SERVICE, contract.POD_NAMESPACE) if not env.get(v)]
    return (
        f"master address: the pod name gives the master's pod name but {' and '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not set; set {' and '.join(missing)} or --master-addr"
    )


def _int_env(env: Mapping[str, str], name: str, errors: list[str]) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        errors.append(f"{name}: {value!r} is not an integer")
        return None
