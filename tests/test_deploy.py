"""The deployment files: Kubernetes manifests valid against the API schemas, the compose scaled
profile wired as documented, and nginx (Debian's) in front of two real replicas sharing a real
Redis, with bench/service.py run through it without an error."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import wait_ready
from tests.test_app_e2e import free_port

ROOT = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def test_kubernetes_manifests_validate():
    manifests = sorted(str(p) for p in (ROOT / "deploy" / "k8s").glob("*.yaml"))
    assert manifests
    result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", *manifests],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    deployment = next(d for d in yaml.safe_load_all((ROOT / "deploy/k8s/nmt.yaml").read_text())
                      if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "NMT_REDIS_URL", "value": "redis://nmt-redis:6379/0"} in container["env"]
    redis = next(yaml.safe_load_all((ROOT / "deploy/k8s/redis.yaml").read_text()))
    assert "--appendonly" in redis["spec"]["template"]["spec"]["containers"][0]["args"]


def test_compose_scaled_profile():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    replica, redis, lb = services["nmt-replica"], services["redis"], services["lb"]
    assert replica["profiles"] == redis["profiles"] == lb["profiles"] == ["scaled"]
    assert replica["environment"]["NMT_REDIS_URL"] == "redis://redis:6379/0" and replica["deploy"]["replicas"] == 2
    assert "--appendonly" in redis["command"] and "volatile-lru" in redis["command"]
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"] and lb["depends_on"] == ["nmt-replica"]
    assert "    server nmt-replica:8000 " in (ROOT / "deploy/nginx.conf").read_text()
    # only lb named: the GPU service (no profile) would start too with a plain `up`
    assert "--scale nmt-replica=3 lb" in (ROOT / "docs" / "deployment.md").read_text()


def test_compose_services_keep_their_devices_batching_defaults():
    """What compose sets when the operator sets nothing gives each service its device's batch
    budget and wait for company (a fixed 4096 once gave the GPU service the CPU's budget)."""
    from app.settings import Settings

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, device in (("nmt", "cuda"), ("nmt-cpu", "cpu"), ("nmt-replica", "cpu")):
        environment = services[name]["environment"]
        assert environment["NMT_DEVICE"] == device
        unset = {key[len("NMT_"):].lower(): re.fullmatch(r"\$\{\w+:-(.*)\}", str(environment[key])).group(1)
                 for key in ("NMT_BATCH_TOKENS", "NMT_MAX_WAIT_MS")}
        composed = Settings(**unset)
        assert composed.batch_token_budget(device) == Settings().batch_token_budget(device), name
        assert composed.batch_wait_s(device) == Settings().batch_wait_s(device), name


@pytest.mark.e2e
@pytest.mark.skipif(not (NGINX and shutil.which("redis-server")), reason="needs nginx and redis-server")
def test_bench_through_nginx_and_two_replicas_runs_clean(tiny_checkpoint, tmp_path):
    from tests.conftest import Redis
    from tests.test_app_redis import start_replica

    redis = Redis(tmp_path)
    redis.start()
    replicas = [start_replica(tiny_checkpoint, redis.url, tmp_path) for _ in range(2)]
    port = free_port()
    config = (ROOT / "deploy/nginx.conf").read_text()
    # no compose DNS here: the two replicas by address
    upstreams = "\n".join(f"    server {url.removeprefix('http://')};" for url, _ in replicas)
    config = re.sub(r"    server nmt-replica:8000 .*", upstreams, config)
    assert upstreams in config
    config = config.replace("listen 80;", f"listen 127.0.0.1:{port};")
    config = config.replace("worker_processes auto;", f"worker_processes 1;\npid {tmp_path}/nginx.pid;\n"
                            f"error_log {tmp_path}/error.log;")
    config = config.replace("http {", f"http {{\n  access_log off;\n  client_body_temp_path {tmp_path};\n"
                            f"  proxy_temp_path {tmp_path};")
    (tmp_path / "nginx.conf").write_text(config)
    nginx = subprocess.Popen([NGINX, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path), "-g", "daemon off;"])
    url = f"http://127.0.0.1:{port}"
    try:
        for replica_url, process in replicas:
            wait_ready(replica_url, [process, nginx])
        report = tmp_path / "bench.json"
        run = subprocess.run([sys.executable, str(ROOT / "bench/service.py"), "--model", str(tiny_checkpoint),
                              "--url", url, "--clients", "8", "--seconds", "4", "--limit", "20", "--no-offline",
                              "--health", "--json", str(report)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        numbers = json.loads(report.read_text())
        assert numbers["errors"] == {} and numbers["rows"][0]["sentences_per_s"] > 0, numbers
        assert len(numbers["health_ms"]) > 20, numbers["health_ms"]  # /health polled through nginx meanwhile
        # both replicas took requests: round robin, no stickiness needed
        served = [httpx.get(f"{u}/metrics").text.count('route="/v1/translate",status="200"') for u, _ in replicas]
        assert all(served), served
    finally:
        nginx.terminate()
        for _, process in replicas:
            process.terminate()
        for _, process in replicas:
            process.wait(30)
        redis.stop()


def test_the_image_takes_every_file_of_the_shipped_models():
    """.dockerignore admits the shipped checkpoints file by file: a file a model reads (its
    shortlist, say) left off the list would be silently missing from the image."""
    from model.config import CHECKPOINT_FILES, SHORTLIST_FILE

    admitted = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for pair in ("en-de", "de-en"):
        present = [name for name in (*CHECKPOINT_FILES, SHORTLIST_FILE) if (ROOT / "checkpoints" / pair / name).exists()]
        assert SHORTLIST_FILE in present
        assert {f"checkpoints/{pair}/{name}" for name in present} <= admitted


def test_the_build_context_holds_everything_the_dockerfile_copies():
    """.dockerignore is an allow-list: a folder the Dockerfile copies but the list leaves out fails
    the build ("no items matching glob"), which CI, building no image, would not see."""
    admitted = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.startswith("!")}
    copied = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied += [w.rstrip("/") for w in words[1:-1] if "[" not in w]  # wheel[s]: optional
    assert {"pyproject.toml", "nmt", "model", "app", "checkpoints"} <= set(copied)
    assert set(copied) <= admitted, set(copied) - admitted


@pytest.mark.parametrize("image", ["localhost/nmt:cuda", "localhost/nmt:cpu"])
def test_a_built_image_runs_the_service_and_the_gpu_search(image):
    """An image built here (docs/container.md: `podman build ... -t nmt:cuda .`): its Python imports
    the service, the CUDA-graph search and the torch variant it was built for. Skipped where podman
    or the image is missing (CI does not build images: 10 minutes and 6 GB for the CUDA one)."""
    import shutil
    import subprocess

    if shutil.which("podman") is None:
        pytest.skip("no podman here")
    if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode != 0:
        pytest.skip(f"{image} is not built here")
    check = ("import torch, app.main, model.graphs, nmt.cli; "
             "print(torch.version.cuda is not None, len(app.main.app.routes) > 5, model.graphs.GraphedBeamSearch.__name__)")
    run = subprocess.run(["podman", "run", "--rm", "--network", "none", image, "python", "-c", check],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    cuda_build = image.endswith(":cuda")
    assert run.stdout.split() == [str(cuda_build), "True", "GraphedBeamSearch"]
