"""Who this pod is: role, index, and where the master is.

Order (first that answers wins):
1. explicit flags, then their environment variables (`--role`/MASKRCNN_ROLE, `--index`/MASKRCNN_INDEX,
   `--master-addr`/MASTER_ADDR, `--master-port`/MASTER_PORT): bare nodes, `docker run`;
2. Kubeflow Trainer v2's torch runtime (trainjob.py): PET_NODE_RANK is the node (0 the master, i worker
   i - 1), PET_MASTER_ADDR/PET_MASTER_PORT the master; whenever PET_* are set they must agree with the
   topology (node count, processes per node, a ddp engine, the port), whatever else answers;
3. a JobSet pod's downward API: MASKRCNN_REPLICATED_JOB (`master` or `workers`), MASKRCNN_JOB_INDEX and
   MASKRCNN_COMPLETION_INDEX (worker i is completion index i), MASKRCNN_JOBSET_NAME;
4. a StatefulSet pod name (POD_NAME, else HOSTNAME) `<prefix>-master-0` or `<prefix>-worker-<i>`;
5. a JobSet host name (HOSTNAME) `<jobset>-master-0-0` or `<jobset>-workers-0-<i>`.
With POD_NAMESPACE, MASKRCNN_HEADLESS_SERVICE and MASKRCNN_CLUSTER_DOMAIN the master's address is its
DNS name: `<prefix>-master-0.<service>.<namespace>.svc.<domain>`, or for a JobSet
`<jobset>-master-0-0.<service>.<namespace>.svc.<domain>` (the service is the JobSet's subdomain).
The master port defaults to the topology's `network.master_port`. The names' formats are the
contract's (`contract.pod_name`, `contract.jobset_host_name` and their parsers), shared with `status`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import ROLES, host_name, jobset_role, parse_jobset_host_name, parse_pod_name
from maskrcnn_launcher.errors import IdentityError
from maskrcnn_launcher.topology import Topology
from maskrcnn_launcher.trainjob import TorchRuntime, checked_torch_runtime

# The master needs no address for itself: rank 0 hosts the store and listens on every interface,
# so on a bare node without --master-addr it records loopback.
SELF_ADDR = "127.0.0.1"
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class IdentityInputs:
    """Values given on the command line; None means "not given" (the environment may answer)."""

    role: str | None = None
    index: int | None = None
    master_addr: str | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class Cluster:
    """Names that make a pod's stable DNS name through the headless Service. `prefix` is the
    StatefulSets' name prefix, or under a JobSet (`workload` "jobset") the JobSet's name."""

    prefix: str
    service: str
    namespace: str
    domain: str = contract.DEFAULT_CLUSTER_DOMAIN
    workload: str = "statefulset"

    def dns_name(self, role: str, index: int) -> str:
        host = host_name(self.workload, self.prefix, role, index)
        return f"{host}.{self.service}.{self.namespace}.svc.{self.domain}"


@dataclass(frozen=True)
class Identity:
    role: str
    index: int
    master_addr: str
    master_port: int
    source: str  # how the role was found, for logs and error messages
    cluster: Cluster | None = None
    pod_ip: str | None = None
    torch_runtime: TorchRuntime | None = None  # the PET_* variables, under Kubeflow Trainer's torch runtime

    @property
    def dns_name(self) -> str | None:
        return self.cluster.dns_name(self.role, self.index) if self.cluster else None


@dataclass(frozen=True)
class _Found:
    """What the pod's own names said: role and index, where from, and the name prefix of its peers."""

    role: str
    index: int
    source: str
    prefix: str | None  # StatefulSet prefix or JobSet name; None when not known
    workload: str


def resolve_identity(inputs: IdentityInputs, env: Mapping[str, str], topology: Topology) -> Identity:
    """Derive this pod's identity; raise `IdentityError` listing every problem."""
    errors: list[str] = []
    torch = checked_torch_runtime(env, topology)
    role = inputs.role or env.get(contract.ROLE) or None
    index = inputs.index if inputs.index is not None else _int_env(env, contract.INDEX, errors)
    found = _from_kubernetes(env, errors) if torch is None else _trainjob_found(torch)

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
    elif found is not None:
        role, index, source = found.role, found.index, found.source
    elif errors:  # the JobSet variables were there but wrong: those are the problems to report
        raise IdentityError(errors)
    else:
        name_var = contract.POD_NAME if env.get(contract.POD_NAME) else contract.HOSTNAME
        name = env.get(name_var, "")
        seen = f"{name_var}={name!r} is not such a name" if name else "no pod name"
        raise IdentityError(
            f"identity: give --role/--index ({contract.ROLE}/{contract.INDEX}), or run in a StatefulSet pod "
            f"named <prefix>-master-0 / <prefix>-worker-<i> ({contract.POD_NAME} or {contract.HOSTNAME}) or in "
            f"a JobSet pod ({contract.REPLICATED_JOB} and {contract.COMPLETION_INDEX}, or the host name "
            f"<jobset>-master-0-0 / <jobset>-workers-0-<i>); {seen}"
        )

    _check_range(role, index, topology, source, errors)
    cluster = _cluster(found, env)
    master_addr = inputs.master_addr or env.get(contract.MASTER_ADDR) or (torch.master_addr if torch else None)
    if master_addr is None:
        if cluster is not None:
            master_addr = cluster.dns_name("master", 0)
        elif role == "master":
            master_addr = SELF_ADDR
        else:
            errors.append(_missing_master_addr(found, env))
            master_addr = ""
    port = inputs.master_port if inputs.master_port is not None else _int_env(env, contract.MASTER_PORT, errors)
    if port is None:
        port = torch.master_port if torch else topology.network.master_port
    elif not 1 <= port <= 65535:
        errors.append(f"master port: {port} is out of range 1..65535 (--master-port / {contract.MASTER_PORT})")
    if errors:
        raise IdentityError(errors)
    return Identity(role, index, master_addr, port, source, cluster, env.get(contract.POD_IP) or None, torch)


def _trainjob_found(torch: TorchRuntime) -> _Found:
    """The identity the torch runtime's variables give; the TrainJob's name (from PET_MASTER_ADDR) is
    the node host names' prefix and their subdomain."""
    role, index = torch.role
    return _Found(role, index, torch.source, torch.trainjob, "trainjob")


def _from_kubernetes(env: Mapping[str, str], errors: list[str]) -> _Found | None:
    """The identity a Kubernetes pod's names give (steps 2 to 4 of the module's order), or None."""
    hostname = env.get(contract.HOSTNAME, "")
    jobset_host = parse_jobset_host_name(hostname) if hostname else None
    replicated_job = env.get(contract.REPLICATED_JOB)
    if replicated_job:
        job_index = _int_env(env, contract.JOB_INDEX, errors)
        completion = _int_env(env, contract.COMPLETION_INDEX, errors)
        if completion is None:
            errors.append(f"{contract.COMPLETION_INDEX}: not set in a JobSet pod ({contract.REPLICATED_JOB} is)")
            return None
        try:
            role, index = jobset_role(replicated_job, job_index or 0, completion)
        except ValueError as exc:
            errors.append(f"{contract.REPLICATED_JOB}={replicated_job}: {exc}")
            return None
        name = env.get(contract.JOBSET_NAME) or (jobset_host[0] if jobset_host else None)
        source = f"{contract.REPLICATED_JOB}={replicated_job}, {contract.COMPLETION_INDEX}={completion}"
        return _Found(role, index, source, name, "jobset")
    name_var = contract.POD_NAME if env.get(contract.POD_NAME) else contract.HOSTNAME
    name = env.get(name_var, "")
    parsed = parse_pod_name(name) if name else None
    if parsed is not None:
        return _Found(parsed[1], parsed[2], f"{name_var}={name}", parsed[0], "statefulset")
    if jobset_host is not None:
        return _Found(jobset_host[1], jobset_host[2], f"{contract.HOSTNAME}={hostname}", jobset_host[0], "jobset")
    return None


def _check_range(role: str, index: int, topology: Topology, source: str, errors: list[str]) -> None:
    if role == "master" and index != 0:
        errors.append(f"index: the master is index 0, got {index} ({source})")
    if role == "worker" and not 0 <= index < len(topology.workers):
        count = len(topology.workers)
        errors.append(
            f"index: worker {index} is out of range: {topology.source} has {count} worker(s) "
            f"(indices 0..{count - 1}) ({source})"
        )


def _cluster(found: _Found | None, env: Mapping[str, str]) -> Cluster | None:
    # A TrainJob's subdomain is the TrainJob's own name (the JobSet plugin's default).
    trainjob = found is not None and found.workload == "trainjob"
    service = found.prefix if trainjob else env.get(contract.HEADLESS_SERVICE)
    namespace = env.get(contract.POD_NAMESPACE)
    if found is None or found.prefix is None or not service or not namespace:
        return None
    domain = env.get(contract.CLUSTER_DOMAIN) or contract.DEFAULT_CLUSTER_DOMAIN
    return Cluster(found.prefix, service, namespace, domain, found.workload)


def _missing_master_addr(found: _Found | None, env: Mapping[str, str]) -> str:
    if found is None:
        return f"master address: give --master-addr / {contract.MASTER_ADDR} (no pod name to derive it from)"
    if found.prefix is None:
        return (
            f"master address: a JobSet pod needs {contract.JOBSET_NAME} (or its host name "
            f"<jobset>-workers-0-<i> in {contract.HOSTNAME}) to name the master; set it or --master-addr"
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
    # Plain decimal digits, as the downward API and the flags' users write them: int() alone would
    # also take "0_1", " 1" or other scripts' digits.
    if _INTEGER.fullmatch(value) is None:
        errors.append(f"{name}: {value!r} is not an integer")
        return None
    return int(value)
