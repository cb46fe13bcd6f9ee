"""Render a KubeRay `RayJob` that runs `hpt run` for one study, with its spec in a ConfigMap.

`render_study` is pure (request in, objects out): a ConfigMap holding the spec YAML as written,
and the RayJob that mounts it on every Ray node and runs `hpt run <mounted spec>`. Any spec then
runs on the published image; nothing is rebuilt. It is the single source of the RayJob shape:
`k8s/base/rayjob.yaml` is its output for the quickstart study, and a test keeps the two equal,
so `hpt k8s render` and the shipped manifests cannot drift apart.

Optional: a Kueue LocalQueue (`queue`: the `kueue.x-k8s.io/queue-name` label, and the RayJob
created suspended so Kueue admits it), and a wall-clock cap (`activeDeadlineSeconds`).

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
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# WORKDIR of the Dockerfile: the image carries the project (and its search_spaces/) under it.
IMAGE_ROOT = "/app"
# Shared study folders (sweep results, plans, checkpoints): Ray Tune needs storage every node
# sees, so head and workers mount the same PersistentVolumeClaim here.
STUDIES_MOUNT = "/studies"
STUDIES_CLAIM = "hpt-studies"
# The study's spec, from its ConfigMap, read-only on every Ray node (head: the driver reads it;
# workers: trials may). The file is `<study name>.yaml`.
SPEC_MOUNT = "/etc/hptransfer/spec"
SERVICE_ACCOUNT = "hptransfer"
RUN_AS_USER = 1000
# Label every hptransfer pod carries; the NetworkPolicies admit exactly these pods.
PART_OF = {"app.kubernetes.io/part-of": "hptransfer"}
# Short Service name: resolves in whatever namespace kustomize or --namespace puts us in.
DEFAULT_TRACKING_URI = "http://mlflow:5000"
# Kueue reads the LocalQueue from this label and admits a suspended job by un-suspending it.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A ConfigMap holds at most 1 MiB in all; keep room for its metadata.
MAX_SPEC_BYTES = 1_000_000
# Preemption: Kubernetes sends SIGTERM and waits terminationGracePeriodSeconds before SIGKILL; a
# stopped Ray job's driver gets SIGTERM from Ray's job supervisor, which waits
# RAY_JOB_STOP_WAIT_TIME_S (default 3 s) before SIGKILL. The large run's driver needs one step and
# one checkpoint (train.stop_checkpoint_after_s): a DeepSpeed checkpoint of a 1B-parameter model with
# Adam is ~16 GB, ~2-3 min to a network volume at 100-150 MB/s, so 5 minutes of grace, of which the
# job supervisor waits all but 30 s (the rest is Ray's own shutdown).
STOP_GRACE_S = 300
JOB_STOP_WAIT_S = STOP_GRACE_S - 30

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A Kubernetes label value: at most 63, alphanumerics at both ends, `-_.` inside.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
# An image reference as Docker parses it: [registry[:port]/]path[:tag][@sha256:<64 hex>].
_IMAGE = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# KubeRay names the cluster "<rayjob>-<5 random chars>" and its head Service after that; a
# Service name must stay within 63 characters, so keep the RayJob name well below.
_MAX_NAME = 40


class ClusterShape(BaseModel):
    """Image, place and size of a Ray cluster. Everything else is fixed policy (above)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "hptransfer"
    """Container image for head, workers and submitter (built from the repo's Dockerfile);
    `REGISTRY/NAME@sha256:<digest>` pins it."""
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

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _IMAGE.match(v):
            raise ValueError(
                f"not an image reference: {v!r} (expected REGISTRY/NAME[:TAG][@sha256:<64 hex digits>], "
                "e.g. ghcr.io/hptransfer/hptransfer:0.1.0-cpu)"
            )
        return v


class RayJobRequest(ClusterShape):
    """A study to run as a RayJob on a fresh cluster of the given shape."""

    study: str
    """The spec's `name`: the study folder /studies/<study>, a label value on every object."""
    spec_yaml: str
    """The spec file's text, shipped as it is in the ConfigMap `<job name>-spec`."""
    name: str | None = None
    """RayJob name; default `hpt-<study>` (lowercased, other characters to '-')."""
    ttl_seconds_after_finished: int = Field(3600, ge=0)
    """Keep the finished cluster's pods this long for log inspection, then delete them."""
    submitter_backoff_limit: int = Field(2, ge=0)
    """Retries of the submitter pod (network blips while the head starts), not of the study."""
    active_deadline_seconds: int | None = Field(86_400, ge=1)
    """Wall-clock cap of the whole RayJob (cluster start included); KubeRay fails the job and
    deletes its cluster after it. None: no cap."""
    queue: str | None = None
    """Kueue LocalQueue in the job's namespace: adds the queue label and creates the RayJob
    suspended, so it starts only when Kueue admits it. None: no Kueue."""

    @field_validator("study")
    @classmethod
    def _study_label(cls, v: str) -> str:
        if not LABEL_VALUE.match(v):
            raise ValueError(
                f"study name {v!r} (the spec's `name`) must be a Kubernetes label value: at most 63 letters, "
                "digits, '-', '_' or '.', beginning and ending with a letter or digit; rename it in the spec"
            )
        return v

    @field_validator("spec_yaml")
    @classmethod
    def _spec_size(cls, v: str) -> str:
        if len(v.encode()) > MAX_SPEC_BYTES:
            raise ValueError(f"spec is {len(v.encode()):,} bytes; a ConfigMap holds at most {MAX_SPEC_BYTES:,}")
        return v

    @field_validator("queue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        if v is not None and (not _DNS1123.match(v) or len(v) > 63):
            raise ValueError(f"Kueue LocalQueue name must be a DNS-1123 label (lowercase, digits, '-'), got {v!r}")
        return v

    @model_validator(mode="after")
    def _name_ok(self) -> RayJobRequest:
        if not _DNS1123.match(self.job_name) or len(self.job_name) > _MAX_NAME:
            raise ValueError(
                f"RayJob name {self.job_name!r} must be a DNS-1123 label of at most {_MAX_NAME} characters; pass --name"
            )
        return self

    @property
    def job_name(self) -> str:
        if self.name:
            return self.name
        return "hpt-" + re.sub(r"[^a-z0-9-]+", "-", self.study.lower()).strip("-")

    @property
    def spec_configmap(self) -> str:
        return f"{self.job_name}-spec"

    @property
    def spec_path(self) -> str:
        """Where the driver finds the spec: SPEC_MOUNT/<study>.yaml."""
        return f"{SPEC_MOUNT}/{self.study}.yaml"


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


def _ray_pod(
    shape: ClusterShape,
    study: str | None,
    *,
    role: str,
    container: dict[str, Any],
    gpus: int,
    spec_configmap: str | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    mounts = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "studies", "mountPath": STUDIES_MOUNT},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
        # Ray's object store lives in /dev/shm; the container default (64 MiB) is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "studies", "persistentVolumeClaim": {"claimName": STUDIES_CLAIM}},
    ]
    if spec_configmap:
        mounts.append({"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True})
        volumes.append({"name": "spec", "configMap": {"name": spec_configmap, "defaultMode": 0o444}})
    container = {
        **container,
        "image": shape.image,
        "env": _env(shape) + (env or []),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": STOP_GRACE_S,  # room for the large run's last checkpoint
        "serviceAccountName": SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
    }
    if gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": _labels("ray", study, **{"hptransfer.dev/ray-role": role})}, "spec": spec}


def ray_cluster_spec(shape: ClusterShape, study: str | None = None, spec_configmap: str | None = None) -> dict[str, Any]:
    """`spec` of a RayCluster (also `spec.rayClusterSpec` of a RayJob): one head, fixed workers;
    with `spec_configmap`, every node mounts that ConfigMap at SPEC_MOUNT."""
    head = _ray_pod(
        shape,
        study,
        role="head",
        gpus=0,
        spec_configmap=spec_configmap,
        # The job supervisor runs on the head: `ray job stop` gives the driver this long after SIGTERM.
        env=[{"name": "RAY_JOB_STOP_WAIT_TIME_S", "value": str(JOB_STOP_WAIT_S)}],
        container={
            "name": "ray-head",
            "ports": [
                {"name": "gcs", "containerPort": 6379},
                {"name": "dashboard", "containerPort": 8265},
                {"name": "client", "containerPort": 10001},
            ],
            "resources": resources(shape.head_cpus, shape.head_memory),
            # Before the SIGTERM to `ray start`: stop the running jobs, so each driver gets its own
            # SIGTERM and checkpoints (deploy/prestop.py: Kueue's preemption deletes the cluster).
            "lifecycle": {"preStop": {"exec": {"command": ["python", "-m", "hptransfer.deploy.prestop"]}}},
        },
    )
    worker = _ray_pod(
        shape,
        study,
        role="worker",
        gpus=shape.gpus_per_worker,
        spec_configmap=spec_configmap,
        container={
            "name": "ray-worker",
            "resources": resources(shape.cpus_per_worker, shape.memory_per_worker, gpus=shape.gpus_per_worker),
        },
    )
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
        "workerGroupSpecs": [
            {
                "groupName": "gpu" if shape.gpus_per_worker else "cpu",
                "replicas": shape.workers,
                "minReplicas": shape.workers,
                "maxReplicas": shape.workers,
                "rayStartParams": {},
                "template": worker,
            }
        ],
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
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": req.image,
                    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}],
                    "resources": resources("1", "1Gi", cpu_request="250m"),
                    "securityContext": container_security_context(),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


def _object_labels(req: RayJobRequest) -> dict[str, str]:
    return {**PART_OF, "app.kubernetes.io/name": "hptransfer", "hptransfer.dev/study": req.study}


def render_spec_configmap(req: RayJobRequest) -> dict[str, Any]:
    """The ConfigMap `<job>-spec` holding the spec as written, under the key `<study>.yaml`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": req.spec_configmap, "namespace": req.namespace, "labels": _object_labels(req)},
        "data": {f"{req.study}.yaml": req.spec_yaml},
    }


def render_rayjob(req: RayJobRequest) -> dict[str, Any]:
    """The RayJob (ray.io/v1) that runs `hpt run SPEC_MOUNT/<study>.yaml --study-dir
    /studies/<study>` on a fresh cluster of one head and `req.workers` workers, deleted
    `ttl_seconds_after_finished` after the job ends. Needs `render_spec_configmap(req)` applied."""
    # --address auto: join the RayJob's cluster (the driver runs on its head) instead of
    # starting a local Ray sized by the spec.
    entrypoint = shlex.join(["hpt", "run", req.spec_path, "--study-dir", f"{STUDIES_MOUNT}/{req.study}", "--address", "auto"])
    # The image already holds the project, so the runtime env carries settings, not code.
    runtime_env = {"env_vars": {e["name"]: e["value"] for e in _env(req) if e["name"] != "HOME"}}
    labels = _object_labels(req)
    spec: dict[str, Any] = {}
    if req.queue:
        # Kueue admits a RayJob by un-suspending it; created running, it would bypass the queue.
        labels[KUEUE_QUEUE_LABEL] = req.queue
        spec["suspend"] = True
    if req.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = req.active_deadline_seconds
    spec.update(
        {
            "entrypoint": entrypoint,
            "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": req.ttl_seconds_after_finished,
            "submitterConfig": {"backoffLimit": req.submitter_backoff_limit},
            "submitterPodTemplate": _submitter_pod(req),
            "rayClusterSpec": ray_cluster_spec(req, req.study, req.spec_configmap),
        }
    )
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": req.job_name, "namespace": req.namespace, "labels": labels},
        "spec": spec,
    }


def render_study(req: RayJobRequest) -> list[dict[str, Any]]:
    """Everything `kubectl apply` needs for one study, in apply order: spec ConfigMap, RayJob."""
    return [render_spec_configmap(req), render_rayjob(req)]


def render_raycluster(shape: ClusterShape, name: str = "hpt-sweeps") -> dict[str, Any]:
    """A long-lived RayCluster for interactive sweeps (submit with launchers/ray_cluster.py
    through `kubectl port-forward svc/<name>-head-svc 8265`)."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": shape.namespace, "labels": {**PART_OF, "app.kubernetes.io/name": "hptransfer"}},
        "spec": ray_cluster_spec(shape),
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (runtimeEnvYAML, the spec) as `|` blocks, so the manifest reads as YAML."""


def _str(d: yaml.SafeDumper, s: str) -> yaml.Node:
    # A `|` block cannot carry trailing spaces or tabs faithfully; those strings stay quoted.
    block = "\n" in s and not any(line != line.rstrip(" \t") for line in s.split("\n"))
    return d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if block else None)


_Dumper.add_representer(str, _str)


def to_yaml(obj: dict[str, Any] | list[dict[str, Any]], header: str = "") -> str:
    """One object, or several as a multi-document stream (`---` between them)."""
    objs = obj if isinstance(obj, list) else [obj]
    body = "---\n".join(
        yaml.dump(o, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=True) for o in objs
    )
    return (header + body) if header else body


_GENERATED = (
    "# Generated by `python -m hptransfer.deploy.render k8s/base` from {what};\n"
    "# edit render.py or the spec, not this file. tests/test_k8s_manifests.py fails when they differ.\n"
)


def base_manifests(project: Path | None = None) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """file name in k8s/base -> (what produced it, objects): the generated part of the base."""
    from hptransfer.deploy.ray_jobs import project_root

    spec_file = (project or project_root()) / "search_spaces" / "quickstart.yaml"
    req = RayJobRequest(study="quickstart", spec_yaml=spec_file.read_text())
    return {
        "rayjob.yaml": ("render_study(search_spaces/quickstart.yaml)", render_study(req)),
        "raycluster.yaml": ("render_raycluster(ClusterShape())", [render_raycluster(ClusterShape())]),
    }


if __name__ == "__main__":  # regenerate the base: python -m hptransfer.deploy.render k8s/base
    import os
    import sys

    out_dir = Path(sys.argv[1])
    for fname, (what, objs) in base_manifests().items():
        tmp = out_dir / f".{fname}.tmp"
        tmp.write_text(to_yaml(objs, _GENERATED.format(what=what)))
        os.replace(tmp, out_dir / fname)
        print(f"wrote {out_dir / fname}")
