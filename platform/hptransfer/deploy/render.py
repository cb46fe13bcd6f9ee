"""Render a KubeRay `RayJob` that runs `hpt run` for one study.

`render_rayjob` is pure (request in, dict out). It is the single source of the RayJob shape:
`k8s/base/rayjob.yaml` is its output for the quickstart study, and a test keeps the two equal,
so `hpt k8s render` and the shipped manifests cannot drift apart.

Security posture baked into every pod (tests check each one):
- non-root user 1000 (the Dockerfile's `hpt` user), seccomp RuntimeDefault, no privilege
  escalation, every capability dropped, read-only root filesystem (writable /tmp and /dev/shm
  are emptyDirs: Ray's session dir and object store live there);
- requests and limits on every container; memory request == limit, because Ray sizes its
  object store and its OOM killer from the limit, and the kubelet evicts pods running above
  their request first;
- no Kubernetes API token (`automountServiceAccountToken: false`): nothing here talks to the API;
- Ray token authentication (`authOptions.mode: token`);
- the head Service is ClusterIP only; the namespace NetworkPolicies in k8s/base admit only
  pods labelled `app.kubernetes.io/part-of: hptransfer`, which every pod here carries.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# WORKDIR of the Dockerfile: the image carries the project's search_spaces/ under it, so a spec
# path inside the image is IMAGE_ROOT/<path relative to the project root>.
IMAGE_ROOT = "/app"
# Shared study folders (sweep results, plans, checkpoints): Ray Tune needs storage every node
# sees, so head and workers mount the same PersistentVolumeClaim here.
STUDIES_MOUNT = "/studies"
STUDIES_CLAIM = "hpt-studies"
SERVICE_ACCOUNT = "hptransfer"
RUN_AS_USER = 1000
# Label every hptransfer pod carries; the NetworkPolicies admit exactly these pods.
PART_OF = {"app.kubernetes.io/part-of": "hptransfer"}
# Short Service name: resolves in whatever namespace kustomize or --namespace puts us in.
DEFAULT_TRACKING_URI = "http://mlflow:5000"

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
# KubeRay names the cluster "<rayjob>-<5 random chars>" and its head Service after that; a
# Service name must stay within 63 characters, so keep the RayJob name well below.
_MAX_NAME = 40


class ClusterShape(BaseModel):
    """Image, place and size of a Ray cluster. Everything else is fixed policy (above)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "hptransfer"
    """Container image for head, workers and submitter (built from the repo's Dockerfile)."""
    namespace: str = "hptransfer"
    """Namespace of the cluster; the mlflow Service and the hpt-studies PVC must be there too."""
    workers: int = Field(1, ge=1)
    """Ray worker pods (the head runs no trials: `num-cpus: 0`)."""
    gpus_per_worker: int = Field(0, ge=0)
    """`nvidia.com/gpu` per worker; > 0 also adds the usual GPU-node toleration."""
    cpus_per_worker: str = "2"
    memory_per_worker: str = "4Gi"
    head_cpus: str = "1"
    head_memory: str = "4Gi"
    tracking_uri: str = DEFAULT_TRACKING_URI
    """MLflow tracking server the run logs to (exported as MLFLOW_TRACKING_URI)."""
    ray_version: str = "2.60.0"

    @field_validator("cpus_per_worker", "memory_per_worker", "head_cpus", "head_memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not _QUANTITY.match(v):
            raise ValueError(f"not a Kubernetes quantity: {v!r} (examples: '2', '500m', '4Gi')")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not _DNS1123.match(v) or len(v) > 63:
            raise ValueError(f"namespace must be a DNS-1123 label (lowercase, digits, '-'), got {v!r}")
        return v


class RayJobRequest(ClusterShape):
    """A study to run as a RayJob on a fresh cluster of the given shape."""

    spec: str
    """Path of the study spec *inside the image*, e.g. /app/search_spaces/quickstart.yaml."""
    name: str | None = None
    """RayJob name; default `hpt-<spec file stem>`."""
    ttl_seconds_after_finished: int = Field(3600, ge=0)
    """Keep the finished cluster's pods this long for log inspection, then delete them."""
    submitter_backoff_limit: int = Field(2, ge=0)
    """Retries of the submitter pod (network blips while the head starts), not of the study."""

    @field_validator("spec")
    @classmethod
    def _spec_absolute(cls, v: str) -> str:
        if not v.startswith("/") or not v.endswith((".yaml", ".yml")):
            raise ValueError(
                f"spec must be an absolute .yaml path inside the image (e.g. {IMAGE_ROOT}/"
                f"search_spaces/quickstart.yaml), got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _name_ok(self) -> RayJobRequest:
        if not _DNS1123.match(self.job_name) or len(self.job_name) > _MAX_NAME:
            raise ValueError(
                f"RayJob name {self.job_name!r} must be a DNS-1123 label of at most {_MAX_NAME} "
                "characters; pass --name"
            )
        return self

    @property
    def study(self) -> str:
        return PurePosixPath(self.spec).stem

    @property
    def job_name(self) -> str:
        if self.name:
            return self.name
        return "hpt-" + re.sub(r"[^a-z0-9-]+", "-", self.study.lower()).strip("-")


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def resources(cpu: str, memory: str, cpu_request: str | None = None, gpus: int = 0) -> dict[str, Any]:
    req = {"cpu": cpu_request or cpu, "memory": memory}
    lim = {"cpu": cpu, "memory": memory}
    if gpus:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(gpus)
    return {"requests": req, "limits": lim}


def _env(shape: ClusterShape) -> list[dict[str, Any]]:
    # HOME and every cache under the writable /tmp: the root filesystem is read-only.
    return [
        {"name": "HOME", "value": "/tmp"},
        {"name": "MLFLOW_TRACKING_URI", "value": shape.tracking_uri},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
        {"name": "TORCH_EXTENSIONS_DIR", "value": "/tmp/torch_extensions"},
    ]


def _labels(component: str, study: str | None, **extra: str) -> dict[str, str]:
    labels = {**PART_OF, "app.kubernetes.io/component": component, **extra}
    if study:
        labels["hptransfer.dev/study"] = study
    return labels


def _ray_pod(shape: ClusterShape, study: str | None, *, role: str, container: dict[str, Any],
             gpus: int) -> dict[str, Any]:
    container = {
        **container,
        "image": shape.image,
        "env": _env(shape),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "studies", "mountPath": STUDIES_MOUNT},
        ],
    }
    spec: dict[str, Any] = {
        "serviceAccountName": SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
            # Ray's object store lives in /dev/shm; the container default (64 MiB) is too small.
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "studies", "persistentVolumeClaim": {"claimName": STUDIES_CLAIM}},
        ],
    }
    if gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": _labels("ray", study, **{"hptransfer.dev/ray-role": role})}, "spec": spec}


def ray_cluster_spec(shape: ClusterShape, study: str | None = None) -> dict[str, Any]:
    """`spec` of a RayCluster (also `spec.rayClusterSpec` of a RayJob): one head, fixed workers."""
    head = _ray_pod(shape, study, role="head", gpus=0, container={
        "name": "ray-head",
        "ports": [
            {"name": "gcs", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ],
        "resources": resources(shape.head_cpus, shape.head_memory),
    })
    worker = _ray_pod(shape, study, role="worker", gpus=shape.gpus_per_worker, container={
        "name": "ray-worker",
        "resources": resources(shape.cpus_per_worker, shape.memory_per_worker, gpus=shape.gpus_per_worker),
    })
    return {
        "rayVersion": shape.ray_version,
        # Ray token auth on GCS, dashboard and Jobs API: KubeRay (>= 1.5.1) generates the token
        # into a Secret and injects RAY_AUTH_MODE/RAY_AUTH_TOKEN into every Ray container and
        # the submitter. Without it anyone who reaches the head can run code on the cluster.
        "authOptions": {"mode": "token"},
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            "serviceType": "ClusterIP",
            # The head schedules no trials: a trial that OOMs must not take the GCS down.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
            "template": head,
        },
        "workerGroupSpecs": [{
            "groupName": "gpu" if shape.gpus_per_worker else "cpu",
            "replicas": shape.workers,
            "minReplicas": shape.workers,
            "maxReplicas": shape.workers,
            "rayStartParams": {},
            "template": worker,
        }],
    }


def _submitter_pod(req: RayJobRequest) -> dict[str, Any]:
    # KubeRay fills in the `ray job submit` command; we fix image, resources and security.
    return {
        "metadata": {"labels": _labels("ray-submitter", req.study)},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(),
            "containers": [{
                "name": "ray-job-submitter",
                "image": req.image,
                "env": [{"name": "HOME", "value": "/tmp"}, {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}],
                "resources": resources("1", "1Gi", cpu_request="250m"),
                "securityContext": container_security_context(),
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


def render_rayjob(req: RayJobRequest) -> dict[str, Any]:
    """The RayJob (ray.io/v1) that runs `hpt run SPEC --study-dir /studies/<study>` on a fresh
    cluster of one head and `req.workers` workers, deleted `ttl_seconds_after_finished` after
    the job ends."""
    # --address auto: join the RayJob's cluster (the driver runs on its head) instead of
    # starting a local Ray sized by the spec.
    entrypoint = shlex.join(["hpt", "run", req.spec, "--study-dir", f"{STUDIES_MOUNT}/{req.study}",
                             "--address", "auto"])
    # The image already holds the project, so the runtime env carries settings, not code.
    runtime_env = {"env_vars": {e["name"]: e["value"] for e in _env(req) if e["name"] != "HOME"}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": req.job_name,
            "namespace": req.namespace,
            "labels": {**PART_OF, "app.kubernetes.io/name": "hptransfer", "hptransfer.dev/study": req.study},
        },
        "spec": {
            "entrypoint": entrypoint,
            "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": req.ttl_seconds_after_finished,
            "submitterConfig": {"backoffLimit": req.submitter_backoff_limit},
            "submitterPodTemplate": _submitter_pod(req),
            "rayClusterSpec": ray_cluster_spec(req, req.study),
        },
    }


def render_raycluster(shape: ClusterShape, name: str = "hpt-sweeps") -> dict[str, Any]:
    """A long-lived RayCluster for interactive sweeps (submit with launchers/ray_cluster.py
    through `kubectl port-forward svc/<name>-head-svc 8265`)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": shape.namespace,
                     "labels": {**PART_OF, "app.kubernetes.io/name": "hptransfer"}},
        "spec": ray_cluster_spec(shape),
    }


def spec_in_image(spec: str) -> str:
    """Map a spec file on this machine to its path in the image. It must lie in a `search_spaces/`
    folder: the Dockerfile copies the project's search_spaces/ to IMAGE_ROOT/search_spaces/."""
    parts = PurePosixPath(Path(spec).resolve().as_posix()).parts
    if "search_spaces" not in parts:
        raise ValueError(
            f"spec {spec!r} is not in a search_spaces/ folder: the image only carries the project's "
            "search_spaces/. Move the spec there and rebuild the image."
        )
    i = len(parts) - 1 - parts[::-1].index("search_spaces")
    return "/".join((IMAGE_ROOT, *parts[i:]))


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (runtimeEnvYAML) as `|` blocks, so the manifest reads as YAML."""


_Dumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def to_yaml(obj: dict[str, Any], header: str = "") -> str:
    body = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return (header + body) if header else body


_GENERATED = ("# Generated by `python -m hptransfer.deploy.render k8s/base` from {what};\n"
              "# edit render.py, not this file. tests/test_k8s_manifests.py fails when they differ.\n")


def base_manifests() -> dict[str, tuple[str, dict[str, Any]]]:
    """file name in k8s/base -> (what produced it, object): the generated part of the base."""
    return {
        "rayjob.yaml": ("render_rayjob(quickstart)",
                        render_rayjob(RayJobRequest(spec=f"{IMAGE_ROOT}/search_spaces/quickstart.yaml"))),
        "raycluster.yaml": ("render_raycluster(ClusterShape())", render_raycluster(ClusterShape())),
    }


if __name__ == "__main__":  # regenerate the base: python -m hptransfer.deploy.render k8s/base
    import os
    import sys

    out_dir = Path(sys.argv[1])
    for fname, (what, obj) in base_manifests().items():
        tmp = out_dir / f".{fname}.tmp"
        tmp.write_text(to_yaml(obj, _GENERATED.format(what=what)))
        os.replace(tmp, out_dir / fname)
        print(f"wrote {out_dir / fname}")
