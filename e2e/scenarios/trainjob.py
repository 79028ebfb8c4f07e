"""The Kubeflow Trainer v2 scenario: the chart's training runtime and TrainJob (ci/kubeflow-values.yaml on
CPU), turned into a JobSet by the emulated Trainer controller (cluster/trainer.py: PET_* from its torch
plugin, KUBEFLOW_TRAINER_SERVER_* from its TrainJobStatus plugin) and run by the emulated JobSet
controller, beside a stand-in for Trainer's status server: an HTTPS server in a container of the same
network, with its own CA (mounted into the training pods) and the token it expects. Both nodes exit 0,
and the server received the progress and the AP that rank 0 posted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .. import checks
from ..checks import Failed, require
from ..cluster import DockerError, Mount, PodSpec, StatusServer, trainjob_objects
from .chart import CHART, DDP_CPU_OVERLAY, helm_template
from .common import NAMESPACE, RELEASE, Settings, trainer_args
from .deployment import Deployment

KUBEFLOW_VALUES = CHART / "ci" / "kubeflow-values.yaml"
TRAINJOB = "e2e-coco"
# Where Trainer's status server lives (trainjobstatus.go: https://<service>.<namespace>.svc:<port>).
SERVER_SERVICE, SERVER_NAMESPACE, SERVER_PORT = "kubeflow-trainer-controller-manager", "kubeflow-system", 8082
SERVER_HOST = f"{SERVER_SERVICE}.{SERVER_NAMESPACE}.svc"
SERVER_DIR = "/etc/status-server"
TOKEN = "e2e.projected-service-account.token"  # what the pods present and the server expects
# The stand-in status server (the image's Python, standard library): pkg/statusserver/server.go's POST
# route, the bearer token checked, each request logged as one `POST {json}` line for the scenario.
SERVER_SCRIPT = """\
import json, ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

D = "/etc/status-server"
TOKEN = open(D + "/token").read().strip()

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        ok = body is not None and self.headers.get("Authorization") == "Bearer " + TOKEN
        seen = {"path": self.path, "client": self.client_address[0], "accepted": ok, "body": body}
        print("POST " + json.dumps(seen), flush=True)
        data = json.dumps(body if ok else {"kind": "Status", "status": "Failure", "message": "Forbidden"}).encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

httpd = ThreadingHTTPServer(("0.0.0.0", int(open(D + "/port").read())), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(D + "/tls.crt", D + "/tls.key")
httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
print("serving", flush=True)
httpd.serve_forever()
"""


def certificates(folder: Path, host: str) -> dict[str, str]:
    """A CA and a certificate for `host` it signed (openssl, EC P-256, a day): PEM texts by file name."""
    openssl = shutil.which("openssl")
    require(openssl is not None, "the trainjob scenario makes its status server's certificates with openssl")
    folder.mkdir(parents=True, exist_ok=True)
    ext = folder / "leaf.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName=DNS:{host},DNS:{host}.cluster.local\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
    for args in (
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=e2e trainer CA"]
        + ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"],
        ["req", *ec[:5], "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1"]
        + ["-out", "tls.crt", "-extfile", ext.name],
    ):
        subprocess.run([openssl, *args], cwd=folder, check=True, capture_output=True, timeout=60)
    return {name: (folder / name).read_text() for name in ("ca.crt", "tls.crt", "tls.key")}


def start_status_server(d: Deployment, tls: dict[str, str]) -> str:
    """The stand-in status server as a pod of the controller's namespace (its Service's DNS names)."""
    name = "trainer-status-server"
    files = {
        "server.py": SERVER_SCRIPT,
        "port": str(SERVER_PORT),
        "token": TOKEN,
        **{k: tls[k] for k in ("tls.crt", "tls.key")},
    }
    spec = PodSpec(
        name=name,
        owner=SERVER_SERVICE,
        ordinal=0,
        component="status-server",
        namespace=SERVER_NAMESPACE,
        service=SERVER_SERVICE,
        cluster_domain="cluster.local",
        image=d.settings.image,
        command=["python3", f"{SERVER_DIR}/server.py"],
        args=[],
        env={},
        mounts=[Mount(SERVER_DIR, "configMap", True, files=files)],
        pod_ip=d.cluster.ip_for(name),
        run_as_user=10001,
        run_as_group=10001,
        read_only_root=True,
        no_new_privileges=True,
        cap_drop=["ALL"],
    )
    container = d.cluster.create_pod(spec)
    d.cluster.start(container)
    d.wait_until("the status server serving", lambda: "serving" in d.cluster.logs(container), 60)
    return container


def received(d: Deployment, server: str) -> list[dict[str, Any]]:
    """Every request the status server logged."""
    lines = d.cluster.logs(server).splitlines()
    return [json.loads(line[len("POST ") :]) for line in lines if line.startswith("POST ")]


def check_posts(posts: list[dict[str, Any]], master_ip: str, final_eval: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 alone posted, with the token; progress went up to 100 at the end with the run's own AP."""
    require(bool(posts), "the status server received nothing")
    refused = [p for p in posts if not p["accepted"]]
    require(not refused, f"the status server refused {len(refused)} post(s): {refused[:1]}")
    clients = {p["client"] for p in posts}
    require(clients == {master_ip}, f"posts came from {clients}, expected rank 0's pod {master_ip} alone")
    wanted = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{TRAINJOB}/status"
    require({p["path"] for p in posts} == {wanted}, f"posted to {sorted({p['path'] for p in posts})}")
    statuses = [p["body"]["trainerStatus"] for p in posts]
    require(all("lastUpdatedTime" in s for s in statuses), "a post without lastUpdatedTime (the CRD requires it)")
    progress = [s["progressPercentage"] for s in statuses]
    require(progress[0] < 100 and progress == sorted(progress), f"progress {progress}: not rising from the start")
    final = statuses[-1]
    require(progress[-1] == 100 and final.get("estimatedRemainingSeconds") == 0, f"the final status was {final}")
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    for key in checks.AP_KEYS:
        require(
            metrics.get(key) == f"{final_eval[key]:.6g}",
            f"{key} posted {metrics.get(key)}, evaluated {final_eval[key]}",
        )
    require({"loss", "lr", "images_per_s"} <= set(metrics), f"the final metrics {sorted(metrics)}")
    return {"posts": len(posts), "progress": progress, "final_metrics": metrics}


def scenario_trainjob(settings: Settings) -> dict[str, Any]:
    """ddp over two TrainJob nodes with the torch runtime's environment; progress and AP reach the
    status server."""
    steps, period = 4, 2
    overlay = {
        **DDP_CPU_OVERLAY,
        "kubeflowTrainer": {"trainJob": {"name": TRAINJOB}},
        "worker": {**DDP_CPU_OVERLAY["worker"], "tolerations": []},
        "spreadAcrossNodes": False,
        "trainer": {"args": trainer_args(steps, period, synthetic=False)},
    }
    with Deployment(settings, "trainjob") as d:
        tls = certificates(d.cluster.host_dir / "tls", SERVER_HOST)
        server = start_status_server(d, tls)
        objects = helm_template(settings.helm, RELEASE, NAMESPACE, d.values_files(KUBEFLOW_VALUES, overlay))
        status = StatusServer(f"https://{SERVER_HOST}:{SERVER_PORT}", tls["ca.crt"], TOKEN)
        js = d.run_jobset([*objects, *trainjob_objects(objects, NAMESPACE, status)], start=False)
        d.prepare_dataset()  # on the claim both nodes mount
        started = time.monotonic()
        js.start()
        require(
            sorted(p.host for p in js.pod_specs()) == [f"{TRAINJOB}-node-0-0", f"{TRAINJOB}-node-0-1"],
            f"host names {[p.host for p in js.pod_specs()]}",
        )
        try:
            state = js.run(900)
        except DockerError as exc:
            raise Failed(str(exc)) from exc
        require(state == "Completed", f"the TrainJob's JobSet ended {state}: {js.condition} ({js.describe()})")
        exits = {p.spec.host: p.exit_code for j in js.attempt.jobs for p in j.pods}
        require(set(exits.values()) == {0}, f"exit codes {exits}")
        final = checks.check_training_complete(d.run_dir, steps)
        require(d.log_has(d.master, r"ddp rank 0 of 2"), "node 0: no 'ddp rank 0 of 2' line")
        posts = received(d, server)
        (d.out / "status-server-posts.json").write_text(json.dumps(posts, indent=1))
        facts = check_posts(posts, d.release.master.pod_ip, final)
        return {"exit_codes": exits, "seconds": round(time.monotonic() - started, 1), **facts}
