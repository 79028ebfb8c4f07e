"""`maskrcnn-launch status`: a release's pods and the master's latest progress, from the Kubernetes API.

It lives on the launcher's side because it talks to the Kubernetes API and must never import torch
(`maskrcnn-dist status` forwards here). It meets the trainer only through the contract.

What it reads, and why each is enough:
- the pods selected by the chart's labels (helm/templates/_helpers.tpl: `app.kubernetes.io/instance`
  is the release, `app.kubernetes.io/part-of` the kit, `app.kubernetes.io/component` the role; the helm
  test pod has component `test` and is left out);
- role and rank from the StatefulSet pod name, parsed by `contract.parse_pod_name`, or for a JobSet's
  pod from the JobSet and Job controllers' labels and annotation (`contract.jobset_role`, the host
  name as a fallback), and ranked by `contract.node_rank` (the same rules that make the pod's rank at
  start-up): master rank 0, worker i rank i + 1. Under ddp with several processes per pod this is the
  pod's node rank;
- for a JobSet release, the JobSet itself (selected by the same release labels): its terminal state
  from its Completed / Failed conditions (with their reason), Suspended while a queue (Kueue) holds
  it, its whole-group restarts (`status.restarts`) against `failurePolicy.maxRestarts`. A cluster
  without the JobSet API, or a user who may not read JobSets, still gets the pods;
- the master's log tail (the newest restart attempt's master for a JobSet), read back with
  `contract.parse_progress_line`, the reader of the line the trainer writes with
  `contract.format_progress_line`.

The `kubernetes` client is an optional extra (`maskrcnn-launcher[k8s]`, or `maskrcnn-dist[k8s]`), so
it is imported inside the functions and the launcher imports without it. Every request carries a
timeout and no retries: a status command must answer quickly, also when the answer is "cannot reach
the cluster".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import (
    ROLES,
    jobset_role,
    node_rank,
    parse_jobset_host_name,
    parse_pod_name,
    parse_progress_line,
)
from maskrcnn_launcher.errors import LauncherError

# Labels the chart puts on every training pod (helm/templates/_helpers.tpl, statefulsets.yaml).
INSTANCE_LABEL = "app.kubernetes.io/instance"
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF_VALUE = "maskrcnn-dist"
COMPONENT_LABEL = "app.kubernetes.io/component"
# The chart's training container; a pod with one container is read whatever its name.
TRAINER_CONTAINER = "trainer"
# The JobSet API (kubernetes-sigs/jobset) the chart renders for.
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"

DEFAULT_TIMEOUT_S = 10.0
# Enough lines to hold a progress line at the default --print-freq between other log lines.
DEFAULT_LOG_LINES = 200
# Where a pod finds its own namespace (the service account mount) when run in-cluster.
INCLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterError(LauncherError):
    """The cluster cannot answer the question: no configuration, unreachable, forbidden, not found.
    The CLI prints it as one `error:` line and exits 2, like every other launcher error."""


class ClusterConfigError(ClusterError): ...


class ClusterUnreachableError(ClusterError): ...


class ClusterPermissionError(ClusterError): ...


class NamespaceNotFoundError(ClusterError): ...


class ReleaseNotFoundError(ClusterError): ...


@dataclass(frozen=True)
class PodStatus:
    name: str
    role: str  # master | worker
    rank: int | None  # None when the name is not a StatefulSet pod name of ours
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    restarts: int  # summed over the pod's containers
    node: str | None  # None while unscheduled
    # Why a container is not running (CrashLoopBackOff, ImagePullBackOff, Error ...): the phase of a
    # crash-looping pod is still Running, so the phase alone hides the problem.
    reason: str | None = None
    restart_attempt: int | None = None  # a JobSet pod's group restart attempt (0 for the first run)


@dataclass(frozen=True)
class JobSetStatus:
    """A JobSet release's own state, as its controller reports it."""

    name: str
    state: str  # Running | Suspended | Completed | Failed
    reason: str | None  # the Completed / Failed condition's reason, e.g. ReachedMaxRestarts
    message: str | None
    restarts: int  # whole-group restarts so far (status.restarts)
    max_restarts: int | None  # spec.failurePolicy.maxRestarts


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    loss: float | None
    images_per_s: float | None
    line: str  # the log line it was read from


@dataclass(frozen=True)
class ReleaseStatus:
    release: str
    namespace: str
    pods: list[PodStatus] = field(default_factory=list)
    progress: Progress | None = None
    # Why there is no progress (master not started yet, log not readable, no train line yet).
    progress_note: str | None = None
    jobset: JobSetStatus | None = None  # None for a StatefulSet release
    jobset_note: str | None = None  # why the JobSet could not be read, when it could not


@dataclass
class Connection:
    """A CoreV1Api and the namespace the configuration names (context, in-cluster pod, or "default")."""

    api: Any
    namespace: str
    server: str

    def close(self) -> None:
        self.api.api_client.close()


def connect(kubeconfig: Path | None = None, *, env: Mapping[str, str] | None = None) -> Connection:
    """Load a kubeconfig (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config) or the in-cluster
    service account, into a private client configuration (the client's global default is untouched)."""
    client, config = _import_kubernetes()
    env = os.environ if env is None else env
    configuration = client.Configuration()
    namespace = "default"
    if kubeconfig is not None:
        if not Path(kubeconfig).is_file():
            raise ClusterConfigError(f"--kubeconfig {kubeconfig} does not exist")
        namespace = _load_kubeconfig(config, str(kubeconfig), configuration)
    elif _default_kubeconfig_exists(env):
        namespace = _load_kubeconfig(config, env.get("KUBECONFIG") or _home_kubeconfig(env), configuration)
    elif env.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise ClusterConfigError(f"in-cluster configuration: {exc}") from exc
        if INCLUSTER_NAMESPACE_FILE.is_file():
            namespace = INCLUSTER_NAMESPACE_FILE.read_text().strip() or namespace
    else:
        where = f"$KUBECONFIG={env['KUBECONFIG']}" if env.get("KUBECONFIG") else _home_kubeconfig(env)
        raise ClusterConfigError(
            f"no cluster configuration: no kubeconfig at {where} and not running in a pod "
            "(give --kubeconfig FILE or set KUBECONFIG)"
        )
    # No retries: a refused connection or a timeout is reported at once, bounded by the timeout.
    configuration.retries = 0
    return Connection(client.CoreV1Api(client.ApiClient(configuration)), namespace, configuration.host)


def release_status(
    release: str,
    namespace: str,
    *,
    api: Any = None,
    kubeconfig: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log_lines: int = DEFAULT_LOG_LINES,
) -> ReleaseStatus:
    """Pods of `release` in `namespace` and the master's latest train line.

    `api` is a `kubernetes.client.CoreV1Api`; without it one is made by `connect(kubeconfig)` and
    closed again. Raises a `ClusterError` (a `LauncherError`) with one line the user can act on."""
    if api is not None:
        return _release_status(api, release, namespace, timeout, log_lines)
    connection = connect(kubeconfig)
    try:
        return _release_status(connection.api, release, namespace, timeout, log_lines)
    finally:
        connection.close()


def render_status(status: ReleaseStatus, *, as_json: bool = False) -> str:
    """A table for people, or JSON (the dataclasses as dicts) for scripts."""
    if as_json:
        return json.dumps(dataclasses.asdict(status), indent=2)
    running = sum(pod.phase == "Running" and pod.reason is None for pod in status.pods)
    lines = [f"release {status.release} in namespace {status.namespace}: {len(status.pods)} pods, {running} running"]
    if status.jobset is not None:
        lines.append(_jobset_text(status.jobset))
    elif status.jobset_note:
        lines.append(f"jobset: not readable ({status.jobset_note})")
    header = ("POD", "ROLE", "RANK", "PHASE", "RESTARTS", "NODE")
    rows = [
        (
            pod.name,
            pod.role,
            "-" if pod.rank is None else str(pod.rank),
            pod.phase if pod.reason is None else f"{pod.phase} ({pod.reason})",
            str(pod.restarts),
            pod.node or "-",
        )
        for pod in status.pods
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.append(f"progress: {_progress_text(status)}")
    return "\n".join(lines)


# -- internals ------------------------------------------------------------------------------------


def _import_kubernetes() -> tuple[Any, Any]:
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ClusterConfigError(
            "the status command needs the kubernetes client: pip install 'maskrcnn-launcher[k8s]'"
        ) from exc
    return client, config


def _home_kubeconfig(env: Mapping[str, str]) -> str:
    return str(Path(env.get("HOME") or Path.home()) / ".kube" / "config")


def _default_kubeconfig_exists(env: Mapping[str, str]) -> bool:
    # $KUBECONFIG may list several files (merged, like kubectl does): one existing is enough.
    paths = env["KUBECONFIG"].split(os.pathsep) if env.get("KUBECONFIG") else [_home_kubeconfig(env)]
    return any(Path(p).is_file() for p in paths if p)


def _load_kubeconfig(config: Any, path: str, configuration: Any) -> str:
    """Fill `configuration` from a kubeconfig; return its current context's namespace (or "default")."""
    try:
        # persist_config=False: a status command never writes back refreshed tokens into the user's file.
        config.load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
        _, current = config.list_kube_config_contexts(config_file=path)
    except config.ConfigException as exc:
        raise ClusterConfigError(f"kubeconfig {path}: {exc}") from exc
    except Exception as exc:  # a file that is not YAML at all: the loader raises whatever yaml raises
        raise ClusterConfigError(f"kubeconfig {path} cannot be read: {_one_line(str(exc))}") from exc
    return ((current or {}).get("context") or {}).get("namespace") or "default"


def _release_status(api: Any, release: str, namespace: str, timeout: float, log_lines: int) -> ReleaseStatus:
    selector = f"{INSTANCE_LABEL}={release},{PART_OF_LABEL}={PART_OF_VALUE},{COMPONENT_LABEL} in ({','.join(ROLES)})"
    server = api.api_client.configuration.host
    missing = f"namespace {namespace} does not exist"
    with _api_errors(server, f"list pods in namespace {namespace}", not_found=missing):
        items = api.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=timeout).items
    jobset, jobset_note = _release_jobset(api, release, namespace, timeout, server)
    if not items and jobset is None:
        _raise_not_found(api, release, namespace, selector, timeout, server)
    pairs = [(_pod_status(pod), pod) for pod in items]
    pairs.sort(key=lambda pair: (pair[0].rank is None, pair[0].rank or 0, pair[0].restart_attempt or 0, pair[0].name))
    pods = [status for status, _ in pairs]
    # A JobSet's master of the newest restart attempt (an older one may still be terminating).
    masters = [(status.restart_attempt or 0, pod) for status, pod in pairs if status.role == "master"]
    master = max(masters, key=lambda pair: pair[0])[1] if masters else None
    if master is None and jobset is not None and jobset.state == "Suspended":
        progress, note = None, "the JobSet is suspended (waiting for admission by a queue such as Kueue): no pods yet"
    else:
        progress, note = _master_progress(api, master, namespace, timeout, log_lines, server)
    return ReleaseStatus(release, namespace, pods, progress, note, jobset, jobset_note)


def _release_jobset(
    api: Any, release: str, namespace: str, timeout: float, server: str
) -> tuple[JobSetStatus | None, str | None]:
    """The release's JobSet, or (None, why not) when there is none or it cannot be read: a cluster
    without the JobSet API answers 404, a user without the permission 403; neither fails the command."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api.api_client)
    selector = f"{INSTANCE_LABEL}={release},{PART_OF_LABEL}={PART_OF_VALUE}"
    try:
        with _api_errors(server, f"list {JOBSET_PLURAL}.{JOBSET_GROUP} in namespace {namespace}"):
            listing = custom.list_namespaced_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                namespace,
                JOBSET_PLURAL,
                label_selector=selector,
                _request_timeout=timeout,
            )
    except ClusterPermissionError as exc:
        return None, str(exc)
    except ApiException as exc:
        if exc.status == 404:  # the JobSet API is not served: a StatefulSet release
            return None, None
        return None, f"cannot list JobSets: {_api_message(exc)}"
    items = sorted(listing.get("items") or [], key=lambda o: o["metadata"]["name"])
    return (_jobset_status(items[0]), None) if items else (None, None)


def _jobset_status(obj: Mapping[str, Any]) -> JobSetStatus:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    terminal = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
        ),
        None,
    )
    if terminal is not None:
        state = terminal["type"]
    else:
        state = "Suspended" if spec.get("suspend") else "Running"
    return JobSetStatus(
        name=obj["metadata"]["name"],
        state=state,
        reason=terminal.get("reason") if terminal else None,
        message=terminal.get("message") if terminal else None,
        restarts=int(status.get("restarts") or 0),
        max_restarts=(spec.get("failurePolicy") or {}).get("maxRestarts"),
    )


def _pod_role(pod: Any) -> tuple[str, int] | None:
    """(role, index) from a StatefulSet pod name, a JobSet pod's labels, or its host name."""
    parsed = parse_pod_name(pod.metadata.name)
    if parsed is not None:
        return parsed[1], parsed[2]
    labels, annotations = pod.metadata.labels or {}, pod.metadata.annotations or {}
    replicated_job = labels.get(contract.REPLICATED_JOB_LABEL)
    completion = annotations.get(contract.COMPLETION_INDEX_ANNOTATION) or labels.get(
        contract.COMPLETION_INDEX_ANNOTATION
    )
    if replicated_job and completion is not None:
        try:
            return jobset_role(replicated_job, int(labels.get(contract.JOB_INDEX_LABEL) or 0), int(completion))
        except ValueError:
            return None
    hostname = pod.spec.hostname if pod.spec else None
    parsed = parse_jobset_host_name(hostname) if hostname else None
    return (parsed[1], parsed[2]) if parsed else None


def _pod_status(pod: Any) -> PodStatus:
    name = pod.metadata.name
    found = _pod_role(pod)
    role = found[0] if found else (pod.metadata.labels or {}).get(COMPONENT_LABEL, "?")
    rank = None if found is None else node_rank(*found)
    attempt = (pod.metadata.labels or {}).get(contract.RESTART_ATTEMPT_LABEL)
    statuses = (pod.status.container_statuses or []) if pod.status else []
    restarts = sum(s.restart_count or 0 for s in statuses)
    reason = next((s.state.waiting.reason for s in statuses if s.state and s.state.waiting), None)
    if reason is None:
        reason = next((s.state.terminated.reason for s in statuses if s.state and s.state.terminated), None)
    phase = (pod.status.phase if pod.status else None) or "Unknown"
    if pod.metadata.deletion_timestamp is not None:
        reason = "Terminating"
    node = pod.spec.node_name if pod.spec else None
    return PodStatus(name, role, rank, phase, restarts, node, reason, int(attempt) if attempt else None)


def _raise_not_found(api: Any, release: str, namespace: str, selector: str, timeout: float, server: str) -> NoReturn:
    """No pod matched: tell a missing namespace (an empty list either way) from a missing release."""
    from kubernetes.client.exceptions import ApiException

    try:
        missing = f"namespace {namespace} does not exist"
        with _api_errors(server, f"get namespace {namespace}", not_found=missing):
            api.read_namespace(namespace, _request_timeout=timeout)
    except ClusterPermissionError:
        pass  # may list pods but not read namespaces: the release is what we can speak about
    except ApiException:
        pass
    raise ReleaseNotFoundError(
        f"no pods of release {release!r} in namespace {namespace} (selector {selector}); "
        f"`helm list -n {namespace}` shows the releases there"
    )


def _master_progress(
    api: Any, master: Any, namespace: str, timeout: float, log_lines: int, server: str
) -> tuple[Progress | None, str | None]:
    """The last train line of the master's log, or why there is none. Only the pod listing is
    essential: a log that cannot be read is a note in the output, not a failure of the command."""
    from kubernetes.client.exceptions import ApiException

    if master is None:
        return None, "no master pod"
    name = master.metadata.name
    # A container that ever ran has a log (a crash-looping one: its last run's); one still being
    # created or pulled has none, and the API would answer 400.
    statuses = master.status.container_statuses or []
    started = any(s.restart_count or (s.state and (s.state.running or s.state.terminated)) for s in statuses)
    if not started:
        return None, f"master pod {name} has not started ({master.status.phase})"
    containers = [c.name for c in master.spec.containers]
    container = TRAINER_CONTAINER if TRAINER_CONTAINER in containers else containers[0]
    try:
        with _api_errors(server, f"get pods/log of {name} in namespace {namespace}"):
            # Raw bytes: the client's own str deserialisation would turn a log that happens to be
            # one JSON document into a Python repr.
            response = api.read_namespaced_pod_log(
                name,
                namespace,
                container=container,
                tail_lines=log_lines,
                _request_timeout=timeout,
                _preload_content=False,
            )
            text = response.data.decode("utf-8", errors="replace")
    except ClusterPermissionError as exc:
        return None, str(exc)
    except ApiException as exc:
        return None, f"cannot read the log of {name}: {_api_message(exc)}"
    for line in reversed(text.splitlines()):
        parsed = parse_progress_line(line)
        if parsed is not None and parsed["kind"] == "train":
            return (
                Progress(parsed["step"], parsed["total"], parsed.get("loss"), parsed.get("images_per_s"), line.strip()),
                None,
            )
    return None, f"no train step in the last {log_lines} log lines of {name}"


@contextmanager
def _api_errors(server: str, doing: str, *, not_found: str | None = None) -> Iterator[None]:
    """Translate the client's exceptions of one request into the one-line errors above. `doing` names
    the verb and resource ("list pods in namespace x") so a 403 says which permission is missing;
    `not_found` is the message for a 404 when that is the user's mistake. Other API errors (a 400 for
    a log not there yet) go on to the caller as `ApiException`."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        if exc.status == 403:
            raise ClusterPermissionError(f"no permission: cannot {doing} ({_api_message(exc)})") from exc
        if exc.status == 401:
            raise ClusterPermissionError(
                f"the API server at {server} rejected the credentials (401) trying to {doing}; "
                "check the kubeconfig's user"
            ) from exc
        if exc.status == 404 and not_found is not None:
            raise NamespaceNotFoundError(not_found) from exc
        if exc.status is None or exc.status >= 500:
            raise ClusterUnreachableError(f"the API server at {server} failed to {doing}: {_api_message(exc)}") from exc
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterUnreachableError(f"cannot reach the Kubernetes API at {server}: {_reason(exc)}") from exc


def _api_message(exc: Any) -> str:
    """The Status object's message of an API error, else its HTTP reason."""
    try:
        message = json.loads(exc.body or "").get("message")
    except (ValueError, AttributeError):
        message = None
    return _one_line(message or f"HTTP {exc.status} {exc.reason}")


def _reason(exc: BaseException) -> str:
    """The innermost cause of a urllib3 error, without the connection object's repr."""
    while getattr(exc, "reason", None) is not None and isinstance(exc.reason, BaseException):
        exc = exc.reason
    text = _one_line(str(exc))
    # "HTTPConnection(host='h', port=1): Failed to establish ..." -> "Failed to establish ..."
    return re.sub(r"^\w+\(.*?\): ", "", text) or type(exc).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _jobset_text(jobset: JobSetStatus) -> str:
    """`jobset NAME: Failed (ReachedMaxRestarts: ...), restarts 3 of 3`."""
    state = jobset.state
    if jobset.reason:
        state += f" ({jobset.reason}: {_one_line(jobset.message)})" if jobset.message else f" ({jobset.reason})"
    limit = f" of {jobset.max_restarts}" if jobset.max_restarts is not None else ""
    return f"jobset {jobset.name}: {state}, restarts {jobset.restarts}{limit}"


def _progress_text(status: ReleaseStatus) -> str:
    progress = status.progress
    if progress is None:
        return f"none ({status.progress_note})" if status.progress_note else "none"
    parts = [f"step {progress.step}/{progress.total} ({100 * progress.step / max(1, progress.total):.0f}%)"]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4g}")
    if progress.images_per_s is not None:
        parts.append(f"images/s {progress.images_per_s:.3g}")
    return "  ".join(parts)
