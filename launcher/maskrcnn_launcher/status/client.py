"""`maskrcnn-launch status`'s Kubernetes API client: the only module that imports `kubernetes`.

It asks the API server for what the report needs (`report.py` reads the answers), and why each is enough:
- the pods selected by the chart's labels (helm/templates/_names.tpl: `app.kubernetes.io/instance`
  is the release, `app.kubernetes.io/part-of` the kit, `app.kubernetes.io/component` the role; the helm
  test pod has component `test` and is left out);
- for a JobSet release, the JobSet itself (selected by the same release labels). A cluster without
  the JobSet API, or a user who may not read JobSets, still gets the pods;
- the master's log tail (the newest restart attempt's master for a JobSet);
- for `--trainjob`, the Kubeflow Trainer TrainJob (a custom object: its conditions and
  status.trainerStatus) and its pods, those of the JobSet named after it (jobset.sigs.k8s.io/jobset-name).

The `kubernetes` client is an optional extra (`maskrcnn-launcher[k8s]`, or `maskrcnn-dist[k8s]`), so
it is imported inside the functions and the launcher imports without it. Every request carries a
timeout and no retries: a status command must answer quickly, also when the answer is "cannot reach
the cluster". Pods and logs are read as the API's own JSON (`_preload_content=False`), the plain data
the report's functions take.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import maskrcnn_launcher.status.report as report
import maskrcnn_launcher.status.trainjob as trainjob
from maskrcnn_launcher.boundary import one_line
from maskrcnn_launcher.contract import JOBSET_NAME_LABEL, ROLES
from maskrcnn_launcher.errors import LauncherError

T = TypeVar("T")
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
) -> report.ReleaseStatus:
    """Pods of `release` in `namespace` and the master's latest train line.

    `api` is a `kubernetes.client.CoreV1Api`; without it one is made by `connect(kubeconfig)` and
    closed again. Raises a `ClusterError` (a `LauncherError`) with one line the user can act on."""
    return _asking(api, kubeconfig, lambda core: _release_status(core, release, namespace, timeout, log_lines))


def trainjob_status(
    name: str, namespace: str, *, api: Any = None, timeout: float = DEFAULT_TIMEOUT_S
) -> trainjob.TrainJobStatus:
    """The TrainJob `name` in `namespace` (trainer.kubeflow.org/v1alpha1) and its pods, through `api` (else
    the default configuration's); a `ClusterError` with one line when it cannot be read."""
    return _asking(api, None, lambda core: _trainjob_status(core, name, namespace, timeout))


# -- internals ------------------------------------------------------------------------------------


def _asking(api: Any, kubeconfig: Path | None, ask: Callable[[Any], T]) -> T:
    """`ask(api)`; without an `api`, with one made by `connect(kubeconfig)` and closed again."""
    if api is not None:
        return ask(api)
    connection = connect(kubeconfig)
    try:
        return ask(connection.api)
    finally:
        connection.close()


def _trainjob_status(api: Any, name: str, namespace: str, timeout: float) -> trainjob.TrainJobStatus:
    from kubernetes import client

    server = api.api_client.configuration.host
    resource = f"{trainjob.TRAINJOB_PLURAL}.{trainjob.TRAINER_GROUP}"
    missing = (
        f"no TrainJob {name!r} in namespace {namespace} (or Kubeflow Trainer's API {trainjob.TRAINER_GROUP}/"
        f"{trainjob.TRAINER_VERSION} is not served there); `kubectl get trainjobs -n {namespace}` lists them"
    )
    with _api_errors(server, f"get {resource} {name} in namespace {namespace}", not_found=missing):
        obj = client.CustomObjectsApi(api.api_client).get_namespaced_custom_object(
            trainjob.TRAINER_GROUP,
            trainjob.TRAINER_VERSION,
            namespace,
            trainjob.TRAINJOB_PLURAL,
            name,
            _request_timeout=timeout,
        )
    with _api_errors(server, f"list pods in namespace {namespace}"):
        response = api.list_namespaced_pod(
            namespace,
            label_selector=f"{JOBSET_NAME_LABEL}={name}",
            _request_timeout=timeout,
            _preload_content=False,
        )
        items = json.loads(response.data).get("items") or []
    return trainjob.read_trainjob(obj, items)


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
        raise ClusterConfigError(f"kubeconfig {path} cannot be read: {one_line(str(exc))}") from exc
    return ((current or {}).get("context") or {}).get("namespace") or "default"


def _release_selector(release: str) -> str:
    """The label selector of the release's objects (the chart's labels)."""
    return f"{report.INSTANCE_LABEL}={release},{report.PART_OF_LABEL}={report.PART_OF_VALUE}"


def _release_status(api: Any, release: str, namespace: str, timeout: float, log_lines: int) -> report.ReleaseStatus:
    selector = f"{_release_selector(release)},{report.COMPONENT_LABEL} in ({','.join(ROLES)})"
    server = api.api_client.configuration.host
    missing = f"namespace {namespace} does not exist"
    with _api_errors(server, f"list pods in namespace {namespace}", not_found=missing):
        response = api.list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=timeout, _preload_content=False
        )
        items = json.loads(response.data).get("items") or []
    jobset, jobset_note = _release_jobset(api, release, namespace, timeout, server)
    if not items and jobset is None:
        _raise_not_found(api, release, namespace, selector, timeout, server)
    pods, master = report.read_pods(items)
    if master is None and jobset is not None and jobset.state == "Suspended":
        progress, note = None, "the JobSet is suspended (waiting for admission by a queue such as Kueue): no pods yet"
    else:
        progress, note = _master_progress(api, master, namespace, timeout, log_lines, server)
    return report.ReleaseStatus(release, namespace, pods, progress, note, jobset, jobset_note)


def _release_jobset(
    api: Any, release: str, namespace: str, timeout: float, server: str
) -> tuple[report.JobSetStatus | None, str | None]:
    """The release's JobSet, or (None, why not) when there is none or it cannot be read: a cluster
    without the JobSet API answers 404, a user without the permission 403; neither fails the command."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(api.api_client)
    selector = _release_selector(release)
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
    return (report.jobset_status(items[0]), None) if items else (None, None)


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
    api: Any, master: report.Obj | None, namespace: str, timeout: float, log_lines: int, server: str
) -> tuple[report.Progress | None, str | None]:
    """The last train line of the master's log, or why there is none. Only the pod listing is
    essential: a log that cannot be read is a note in the output, not a failure of the command."""
    from kubernetes.client.exceptions import ApiException

    if master is None:
        return None, "no master pod"
    name = master["metadata"]["name"]
    why_not = report.not_started(master)
    if why_not is not None:
        return None, why_not
    try:
        with _api_errors(server, f"get pods/log of {name} in namespace {namespace}"):
            # Raw bytes: the client's own str deserialisation would turn a log that happens to be
            # one JSON document into a Python repr.
            response = api.read_namespaced_pod_log(
                name,
                namespace,
                container=report.log_container(master),
                tail_lines=log_lines,
                _request_timeout=timeout,
                _preload_content=False,
            )
            text = response.data.decode("utf-8", errors="replace")
    except ClusterPermissionError as exc:
        return None, str(exc)
    except ApiException as exc:
        return None, f"cannot read the log of {name}: {_api_message(exc)}"
    return report.latest_progress(text, name, log_lines)


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
    return one_line(message or f"HTTP {exc.status} {exc.reason}")


def _reason(exc: BaseException) -> str:
    """The innermost cause of a urllib3 error, without the connection object's repr."""
    while getattr(exc, "reason", None) is not None and isinstance(exc.reason, BaseException):
        exc = exc.reason
    text = one_line(str(exc))
    # "HTTPConnection(host='h', port=1): Failed to establish ..." -> "Failed to establish ..."
    return re.sub(r"^\w+\(.*?\): ", "", text) or type(exc).__name__
