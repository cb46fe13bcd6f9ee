"""Every kustomize overlay and every `hpt k8s render` output: built with the real `kubectl
kustomize`, validated against the Kubernetes schemas (kubernetes-validate, strict: unknown fields
fail) and the KubeRay CRDs' openAPIV3Schema (also made strict), then checked for the security
posture and for entrypoints that name real `hpt` commands and shipped specs. No cluster needed.

Not covered here: the CRDs' CEL rules (x-kubernetes-validations) need an API server.
"""

from __future__ import annotations

import base64
import copy
import functools
import ipaddress
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from hptransfer.deploy import cli as deploy_cli
from hptransfer.deploy import render
from hptransfer.deploy.kube import kustomize_build

REPO = Path(__file__).resolve().parents[1]
# ../shared next to the repo (CI and every workstation): never an absolute path.
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"
OVERLAYS = ["cpu-dev", "gpu-prod"]
K8S_VERSION = "1.32"  # the kubectl on these machines; KubeRay 1.7 supports it
# Secrets the platform team creates outside git (k8s/README.md says how), per overlay.
EXTERNAL_SECRETS = {"cpu-dev": set(), "gpu-prod": {"mlflow-backend"}}
# The `hpt` interface the manifests rely on (PRODUCT.md / the lead's CLI).
DOCUMENTED_VERBS = {"run", "sweep", "transfer", "train", "validate", "coord-check", "dp-plan", "report"}
PART_OF = ("app.kubernetes.io/part-of", "hptransfer")
# The cloud instance metadata endpoint (AWS, GCP, Azure, OpenStack; AWS IPv6): no pod may reach it.
METADATA_ADDRESSES = [ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")]


# ---------------------------------------------------------------- schema validation


def _strict(schema: Any) -> Any:
    """OpenAPI v3 structural schema -> JSON Schema that rejects unknown fields, as
    `kubectl apply --validate=strict` does (the API server would silently prune them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-validations")}
    if "properties" in out and "additionalProperties" not in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> validator, from every CRD in ../shared/schemas/kuberay."""
    files = sorted(KUBERAY_SCHEMAS.glob("*.yaml"))
    assert files, f"no KubeRay CRDs in {KUBERAY_SCHEMAS}: the shared/ folder must sit next to the repo"
    validators = {}
    for f in files:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 2 MB of YAML
        for crd in yaml.load_all(f.read_text(), Loader=loader):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                schema = _strict(v["schema"]["openAPIV3Schema"])
                validators[(f"{group}/{v['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one object ([] when valid)."""
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key[0].startswith("ray.io/"):
        validator = crd_validators().get(key)
        if validator is None:
            return [f"{where}: no KubeRay CRD for {key}"]
        errors = [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        name = obj.get("metadata", {}).get("name", "")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
            errors.append(f"{where}: metadata.name is not DNS-1123")
        return errors
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{where}: {e.message}"]
    return []


@functools.cache
def build(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize_build(REPO / "k8s" / "overlays" / overlay))


def objects(overlay: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(build(overlay)))


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def overlay_settings(overlay: str, root: Path = REPO) -> dict[str, str]:
    """The overlay's `hptransfer-settings` literals (k8s/components/settings copies them)."""
    kz = yaml.safe_load((root / "k8s" / "overlays" / overlay / "kustomization.yaml").read_text())
    gens = [g for g in kz.get("configMapGenerator", []) if g["name"] == "hptransfer-settings"]
    assert len(gens) == 1, f"{overlay}: no hptransfer-settings configMapGenerator"
    return dict(lit.split("=", 1) for lit in gens[0]["literals"])


def operator_namespaces(objs: list[dict[str, Any]]) -> set[str]:
    """Namespaces from which the NetworkPolicies admit the KubeRay operator."""
    return {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for n in objs
        if n["kind"] == "NetworkPolicy"
        for rule in n["spec"].get("ingress", [])
        for peer in rule.get("from", [])
        if _is_kuberay_operator(peer)
    }


# ---------------------------------------------------------------- pod templates


def pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) for every pod an object makes."""
    kind, name, spec = obj["kind"], obj["metadata"]["name"], obj.get("spec", {})
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        yield f"{kind}/{name}", spec["template"]
    elif kind == "Pod":
        yield f"Pod/{name}", obj
    elif kind in ("RayCluster", "RayJob"):
        cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec", {})
        if cluster:
            yield f"{kind}/{name} head", cluster["headGroupSpec"]["template"]
            for g in cluster.get("workerGroupSpecs", []):
                yield f"{kind}/{name} worker {g['groupName']}", g["template"]
        if kind == "RayJob":
            assert "submitterPodTemplate" in spec, (
                f"RayJob/{name}: set submitterPodTemplate, or KubeRay's default submitter pod runs without our securityContext"
            )
            yield f"RayJob/{name} submitter", spec["submitterPodTemplate"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return spec.get("initContainers", []) + spec["containers"]


_UNITS = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(q: str | int) -> float:
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q))
    assert m and m.group(2) in {"", *_UNITS}, f"not a quantity: {q!r}"
    return float(m.group(1)) * _UNITS.get(m.group(2), 1)


def security_problems(objs: list[dict[str, Any]], external_secrets: set[str]) -> list[str]:
    """Every violation of the posture in k8s/README.md, across all objects at once."""
    p: list[str] = []
    secrets = {o["metadata"]["name"] for o in objs if o["kind"] == "Secret"} | external_secrets
    credential = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|API_KEY|ACCESS_KEY|CREDENTIAL|BACKEND_STORE_URI")
    for obj in objs:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "Service" and obj["spec"].get("type") != "ClusterIP":
            p.append(f"Service/{name}: type must be ClusterIP, got {obj['spec'].get('type')!r}")
        if kind in ("Ingress", "Route", "Gateway"):
            p.append(f"{kind}/{name}: nothing may be exposed outside the cluster")
        if kind in ("RayCluster", "RayJob"):
            cluster = obj["spec"] if kind == "RayCluster" else obj["spec"]["rayClusterSpec"]
            head = cluster["headGroupSpec"]
            if head.get("serviceType") != "ClusterIP" or head.get("enableIngress"):
                p.append(f"{kind}/{name}: head serviceType must be ClusterIP without ingress")
            if cluster.get("authOptions", {}).get("mode") != "token":
                p.append(f"{kind}/{name}: set authOptions.mode: token (Ray token auth on GCS and Jobs API)")
        for where, pod in pod_templates(obj):
            labels = pod.get("metadata", {}).get("labels", {})
            if labels.get(PART_OF[0]) != PART_OF[1]:
                p.append(f"{where}: pod label {PART_OF[0]}={PART_OF[1]} missing (NetworkPolicies admit only those)")
            ps = pod["spec"]
            psc = ps.get("securityContext", {})
            if psc.get("runAsNonRoot") is not True or psc.get("runAsUser", 0) == 0:
                p.append(f"{where}: pod securityContext needs runAsNonRoot: true and a non-zero runAsUser")
            if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                p.append(f"{where}: pod securityContext.seccompProfile.type must be RuntimeDefault")
            if ps.get("automountServiceAccountToken") is not False:
                p.append(f"{where}: automountServiceAccountToken must be false (no pod calls the API)")
            for flag in ("hostNetwork", "hostPID", "hostIPC"):
                if ps.get(flag):
                    p.append(f"{where}: {flag} must not be set")
            for vol in ps.get("volumes", []):
                if "hostPath" in vol:
                    p.append(f"{where}: hostPath volume {vol['name']!r} not allowed")
                if "secret" in vol:
                    p.append(f"{where}: mount {vol['name']!r}: credentials only via env secretKeyRef")
            for c in containers(pod):
                cw = f"{where} container {c['name']}"
                sc = c.get("securityContext", {})
                if sc.get("allowPrivilegeEscalation") is not False:
                    p.append(f"{cw}: securityContext.allowPrivilegeEscalation must be false")
                if sc.get("privileged"):
                    p.append(f"{cw}: privileged must not be set")
                if "ALL" not in sc.get("capabilities", {}).get("drop", []) or sc.get("capabilities", {}).get("add"):
                    p.append(f"{cw}: capabilities must drop ALL and add none")
                if sc.get("runAsUser") == 0:
                    p.append(f"{cw}: runAsUser 0")
                res = c.get("resources", {})
                for r in ("cpu", "memory"):
                    req, lim = res.get("requests", {}).get(r), res.get("limits", {}).get(r)
                    if req is None or lim is None:
                        p.append(f"{cw}: resources.requests.{r} and resources.limits.{r} are both required")
                    elif quantity(req) > quantity(lim):
                        p.append(f"{cw}: {r} request {req} exceeds limit {lim}")
                if c.get("envFrom"):
                    p.append(f"{cw}: envFrom imports unnamed keys; name each variable")
                for e in c.get("env", []):
                    src = e.get("valueFrom", {})
                    if credential.search(e["name"]) and "secretKeyRef" not in src:
                        p.append(f"{cw}: env {e['name']} looks like a credential: take it from a secretKeyRef")
                    if "value" in e and re.search(r"://[^/@\s]+:[^/@\s]+@", str(e["value"])):
                        p.append(f"{cw}: env {e['name']} embeds user:password in a URI")
                    ref = src.get("secretKeyRef")
                    if ref and ref["name"] not in secrets:
                        p.append(
                            f"{cw}: env {e['name']} refers to Secret {ref['name']!r}, which is neither "
                            f"built nor a documented external Secret {sorted(external_secrets)}"
                        )
    return p


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "extend _selects for matchExpressions"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _is_kuberay_operator(peer: dict[str, Any]) -> bool:
    ns = peer.get("namespaceSelector", {}).get("matchLabels", {})
    pods = peer.get("podSelector", {}).get("matchLabels", {})
    return (
        set(peer) == {"namespaceSelector", "podSelector"}
        and set(ns) == {"kubernetes.io/metadata.name"}
        and pods == {"app.kubernetes.io/name": "kuberay-operator"}
    )


def egress_problems(policies: list[dict[str, Any]]) -> list[str]:
    """Every pod is under an egress policy, and no egress rule reaches the cloud metadata endpoint."""
    p: list[str] = []
    egress = [n for n in policies if "Egress" in n["spec"].get("policyTypes", [])]
    if not any(n["spec"]["podSelector"] == {} for n in egress):
        p.append("no egress NetworkPolicy for every pod (podSelector: {}, policyTypes: [Egress])")
    for n in egress:
        name = n["metadata"]["name"]
        for rule in n["spec"].get("egress", []):
            if not rule.get("to"):
                p.append(
                    f"NetworkPolicy/{name}: an egress rule without `to` admits every address, the metadata endpoint included"
                )
            for peer in rule.get("to", []):
                block = peer.get("ipBlock")
                if not block:
                    continue
                cidr = ipaddress.ip_network(block["cidr"])
                excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
                for addr in METADATA_ADDRESSES:
                    if addr in cidr and not any(addr in e for e in excepted):
                        p.append(
                            f"NetworkPolicy/{name}: ipBlock {block['cidr']} reaches the cloud metadata endpoint "
                            f"{addr}; add it to `except`"
                        )
    return p


def network_problems(objs: list[dict[str, Any]], operator_namespace: str | None = None) -> list[str]:
    """Ingress as k8s/README.md states it, egress via `egress_problems`; with `operator_namespace`,
    the KubeRay operator must be admitted from exactly that namespace."""
    p: list[str] = []
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    if not any(
        n["spec"]["podSelector"] == {} and n["spec"].get("policyTypes") == ["Ingress"] and not n["spec"].get("ingress")
        for n in policies
    ):
        p.append("no default-deny ingress NetworkPolicy (podSelector: {}, policyTypes: [Ingress], no rules)")
    for n in policies:
        name = n["metadata"]["name"]
        for rule in n["spec"].get("ingress", []):
            peers = rule.get("from")
            if not peers:
                p.append(f"NetworkPolicy/{name}: an ingress rule without `from` admits everyone")
            for peer in peers or []:
                if _is_kuberay_operator(peer):
                    # the one outside caller: operator -> head dashboard, port 8265 only
                    ports = [x.get("port") for x in rule.get("ports", [])]
                    head_only = n["spec"]["podSelector"].get("matchLabels", {}).get("hptransfer.dev/ray-role") == "head"
                    if ports != [8265] or not head_only:
                        p.append(f"NetworkPolicy/{name}: the KubeRay operator may reach only Ray heads on 8265")
                    ns = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    if operator_namespace is not None and ns != operator_namespace:
                        p.append(
                            f"NetworkPolicy/{name}: admits the KubeRay operator from namespace {ns!r}, but it "
                            f"is installed in {operator_namespace!r} (set kuberay-operator-namespace)"
                        )
                elif set(peer) != {"podSelector"} or peer["podSelector"].get("matchLabels", {}).get(PART_OF[0]) != PART_OF[1]:
                    p.append(
                        f"NetworkPolicy/{name}: peer {peer} is not a same-namespace podSelector on {PART_OF[0]}={PART_OF[1]}"
                    )
    # The Ray nodes and MLflow must be covered by an allow policy (and so by nothing wider).
    allow = [n for n in policies if n["spec"].get("ingress")]
    for obj in objs:
        for where, pod in pod_templates(obj):
            labels = pod.get("metadata", {}).get("labels", {})
            is_ray = "head" in where or "worker" in where
            is_mlflow = labels.get("app.kubernetes.io/name") == "mlflow"
            if (is_ray or is_mlflow) and not any(_selects(n["spec"]["podSelector"], labels) for n in allow):
                p.append(f"{where}: no NetworkPolicy admits the job's pods to it")
    return p + egress_problems(policies)


# ---------------------------------------------------------------- entrypoints


@functools.cache
def real_verbs() -> dict[str, Any]:
    """Commands registered on the real `hpt` Typer app, name -> click command."""
    import typer.main

    from hptransfer.cli import app

    group = typer.main.get_command(app)
    return dict(getattr(group, "commands", {}))


def command_problems(argv: list[str], where: str) -> list[str]:
    p: list[str] = []
    if not argv or argv[0] != "hpt":
        return [f"{where}: entrypoint must start with `hpt`, got {argv[:1]}"]
    verb, args = (argv[1] if len(argv) > 1 else ""), argv[2:]
    verbs = real_verbs()
    pipeline_verbs = set(verbs) - {"k8s"}
    if verb not in DOCUMENTED_VERBS:
        p.append(f"{where}: `hpt {verb}` is not an hpt command ({sorted(DOCUMENTED_VERBS)})")
    if pipeline_verbs:  # once the lead's commands are registered, hold manifests to the real app
        if verb not in verbs:
            p.append(f"{where}: `hpt {verb}` is not registered on hptransfer.cli.app ({sorted(verbs)})")
        else:
            opts = {o for prm in verbs[verb].params for o in prm.opts}
            for a in args:
                if a.startswith("--") and a.split("=")[0] not in opts:
                    p.append(f"{where}: `hpt {verb}` has no option {a} (has {sorted(opts)})")
    for a in args:  # specs mounted from a ConfigMap are checked by spec_mount_problems
        if a.endswith((".yaml", ".yml")) and not a.startswith((render.STUDIES_MOUNT, render.SPEC_MOUNT)):
            local = REPO / Path(a).relative_to(render.IMAGE_ROOT) if a.startswith(render.IMAGE_ROOT) else REPO / a
            if not local.is_file():
                p.append(f"{where}: spec {a} does not exist in the repo (looked for {local})")
    return p


def spec_mount_problems(objs: list[dict[str, Any]]) -> list[str]:
    """Each RayJob's spec comes from a ConfigMap in the same build, mounted read-only on every Ray
    node, holding a spec that parses, whose `name` is the study the job writes and is labelled."""
    from hptransfer.spec import parse_spec

    p: list[str] = []
    maps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    for job in (o for o in objs if o["kind"] == "RayJob"):
        where = f"RayJob/{job['metadata']['name']}"
        argv = shlex.split(job["spec"]["entrypoint"])
        specs = [a for a in argv if a.startswith(render.SPEC_MOUNT + "/")]
        if len(specs) != 1:
            p.append(f"{where}: entrypoint must name one spec under {render.SPEC_MOUNT}/, got {argv}")
            continue
        key = specs[0].removeprefix(render.SPEC_MOUNT + "/")
        cluster = job["spec"]["rayClusterSpec"]
        pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
        cm_names = set()
        for pod in pods:
            vols = {v["name"]: v for v in pod["spec"]["volumes"]}
            mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == render.SPEC_MOUNT]
            if len(mounts) != 1 or not mounts[0].get("readOnly") or "configMap" not in vols.get(mounts[0]["name"], {}):
                p.append(f"{where}: every Ray node must mount the spec ConfigMap read-only at {render.SPEC_MOUNT}")
                continue
            cm_names.add(vols[mounts[0]["name"]]["configMap"]["name"])
        if len(cm_names) != 1 or (cm := maps.get(next(iter(cm_names)))) is None:
            p.append(f"{where}: spec ConfigMap {sorted(cm_names)} not in the build (have {sorted(maps)})")
            continue
        if key not in cm.get("data", {}):
            p.append(f"{where}: ConfigMap/{cm['metadata']['name']} has no key {key!r}")
            continue
        name = parse_spec(yaml.safe_load(cm["data"][key]), key).name
        study_dir = argv[argv.index("--study-dir") + 1] if "--study-dir" in argv else None
        if key != f"{name}.yaml" or study_dir != f"{render.STUDIES_MOUNT}/{name}":
            p.append(
                f"{where}: spec name {name!r} must give the key {name}.yaml and --study-dir "
                f"{render.STUDIES_MOUNT}/{name}; got {key!r}, {study_dir!r}"
            )
        if job["metadata"]["labels"].get("hptransfer.dev/study") != name:
            p.append(f"{where}: label hptransfer.dev/study must be the spec's name {name!r}")
    return p


def entrypoints(objs: list[dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    for obj in objs:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "RayJob":
            yield f"RayJob/{name}", shlex.split(obj["spec"]["entrypoint"])
        elif kind in ("Job", "Deployment") and name != "mlflow":
            for c in obj["spec"]["template"]["spec"]["containers"]:
                yield f"{kind}/{name}", c.get("command", []) + c.get("args", [])


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_every_object_validates(overlay: str) -> None:
    objs = objects(overlay)
    kinds = sorted(o["kind"] for o in objs)
    for kind in (
        "Namespace",
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "RayJob",
        "RayCluster",
        "Job",
    ):
        assert kind in kinds, f"{overlay}: no {kind} in the build ({kinds})"
    assert kinds.count("Job") == 3, "one batch Job each for transfer, dp-plan and report"
    errors = [e for o in objs for e in schema_errors(o)]
    assert not errors, f"{overlay}: schema errors:\n" + "\n".join(errors)
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert namespaces == {one(objs, "Namespace")["metadata"]["name"]}, namespaces


def test_validators_reject_broken_objects() -> None:
    """The schema checks above must be able to fail: break objects the way people do."""
    objs = objects("gpu-prod")
    job = one(objs, "RayJob")
    typo = copy.deepcopy(job)
    typo["spec"]["shutdownAfterJobFinish"] = typo["spec"].pop("shutdownAfterJobFinishes")
    assert any("shutdownAfterJobFinish" in e for e in schema_errors(typo))
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "four"
    assert schema_errors(wrong_type)
    no_template = copy.deepcopy(one(objs, "RayCluster"))
    del no_template["spec"]["headGroupSpec"]["template"]
    assert schema_errors(no_template)
    dep = copy.deepcopy(one(objs, "Deployment", "mlflow"))
    dep["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert schema_errors(dep)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_posture(overlay: str) -> None:
    objs = objects(overlay)
    problems = security_problems(objs, EXTERNAL_SECRETS[overlay]) + network_problems(
        objs, overlay_settings(overlay)["kuberay-operator-namespace"]
    )
    assert not problems, f"{overlay}:\n" + "\n".join(problems)
    ns = one(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for o in objs:
        if o["kind"] == "Secret":  # only the dev overlay's generated, credential-free one
            assert overlay == "cpu-dev" and o["metadata"]["name"].startswith("mlflow-backend-"), o["metadata"]
            for v in o.get("data", {}).values():
                assert base64.b64decode(v).decode().startswith("sqlite:"), "no real credential in git"


def test_security_checks_catch_violations() -> None:
    objs = objects("cpu-dev")
    bad = copy.deepcopy(objs)
    dep = one(bad, "Deployment", "mlflow")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["securityContext"]["allowPrivilegeEscalation"] = True
    del c["resources"]["limits"]
    c["env"].append({"name": "DB_PASSWORD", "value": "hunter2"})
    dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0
    one(bad, "Service", "mlflow")["spec"]["type"] = "LoadBalancer"
    job = one(bad, "RayJob")
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceType"] = "NodePort"
    job["spec"]["submitterPodTemplate"]["metadata"]["labels"].pop(PART_OF[0])
    del one(bad, "RayCluster")["spec"]["authOptions"]
    problems = "\n".join(security_problems(bad, set()))
    for needle in (
        "allowPrivilegeEscalation",
        "resources.limits.cpu",
        "DB_PASSWORD",
        "runAsNonRoot",
        "Service/mlflow: type must be ClusterIP",
        "head serviceType",
        "submitter: pod label",
        "RayCluster/hpt-sweeps: set authOptions.mode: token",
    ):
        assert needle in problems, f"{needle!r} not reported in:\n{problems}"
    open_policy = copy.deepcopy(objs)
    one(open_policy, "NetworkPolicy", "mlflow-from-hptransfer")["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
    assert any("not a same-namespace podSelector" in x for x in network_problems(open_policy))
    wide_operator = copy.deepcopy(objs)
    one(wide_operator, "NetworkPolicy", "ray-head-from-kuberay-operator")["spec"]["ingress"][0]["ports"] = []
    assert any("only Ray heads on 8265" in x for x in network_problems(wide_operator))
    no_deny = [o for o in objs if o["metadata"]["name"] != "default-deny-ingress"]
    assert any("default-deny" in x for x in network_problems(no_deny))
    assert any("installed in 'ray-ops'" in x for x in network_problems(objs, "ray-ops"))


def test_egress_checks_catch_the_metadata_endpoint() -> None:
    objs = objects("cpu-dev")
    assert not egress_problems([o for o in objs if o["kind"] == "NetworkPolicy"])
    for mutate, needle in [
        (lambda r: r[1]["to"][0]["ipBlock"].pop("except"), "169.254.169.254"),
        (lambda r: r[1]["to"][1]["ipBlock"].update({"except": []}), "fd00:ec2::254"),
        (lambda r: r[1]["to"][0]["ipBlock"].update({"except": ["10.0.0.0/8"]}), "169.254.169.254"),
        (lambda r: r.append({}), "without `to`"),
        (lambda r: r.append({"to": [{"ipBlock": {"cidr": "169.254.0.0/16"}}]}), "169.254.0.0/16"),
    ]:
        bad = copy.deepcopy(objs)
        mutate(one(bad, "NetworkPolicy", "egress-no-cloud-metadata")["spec"]["egress"])
        problems = network_problems(bad)
        assert any(needle in x for x in problems), (needle, problems)
    no_egress = [o for o in objs if o["metadata"]["name"] != "egress-no-cloud-metadata"]
    assert any("no egress NetworkPolicy" in x for x in network_problems(no_egress))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_entrypoints_name_real_hpt_commands_and_specs(overlay: str) -> None:
    found = list(entrypoints(objects(overlay)))
    assert {w.split("/")[0] for w, _ in found} == {"RayJob", "Job"}
    verbs = {argv[1] for _, argv in found}
    assert {"run", "transfer", "dp-plan", "report"} <= verbs, verbs
    problems = [p for where, argv in found for p in command_problems(argv, where)] + spec_mount_problems(objects(overlay))
    assert not problems, "\n".join(problems)
    cm = one(objects(overlay), "ConfigMap", "hpt-quickstart-spec")
    assert cm["data"]["quickstart.yaml"] == (REPO / "search_spaces" / "quickstart.yaml").read_text()


def test_spec_mount_check_catches_a_missing_or_wrong_configmap() -> None:
    objs = objects("cpu-dev")
    no_cm = [o for o in objs if o["kind"] != "ConfigMap"]
    assert any("not in the build" in x for x in spec_mount_problems(no_cm))
    renamed = copy.deepcopy(objs)
    one(renamed, "ConfigMap")["data"] = {"other.yaml": "name: other\n"}
    assert any("no key 'quickstart.yaml'" in x for x in spec_mount_problems(renamed))
    unmounted = copy.deepcopy(objs)
    one(unmounted, "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "volumeMounts"
    ].pop()
    assert any("every Ray node must mount" in x for x in spec_mount_problems(unmounted))


def test_entrypoint_check_catches_unknown_verb_and_missing_spec() -> None:
    problems = command_problems(["hpt", "sweeep", "/app/search_spaces/nope.yaml"], "x")
    assert any("sweeep" in p for p in problems) and any("nope.yaml" in p for p in problems)


def test_rayjob_has_the_issue_fields() -> None:
    for overlay in OVERLAYS:
        spec = one(objects(overlay), "RayJob")["spec"]
        assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
        assert spec["activeDeadlineSeconds"] == 86_400 and "suspend" not in spec  # no Kueue in the base
        assert spec["submitterConfig"]["backoffLimit"] >= 1
        env = yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
        assert env["MLFLOW_TRACKING_URI"] == render.DEFAULT_TRACKING_URI
    gpu = one(objects("gpu-prod"), "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    cpu = one(objects("cpu-dev"), "RayJob")["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert "nvidia.com/gpu" not in cpu["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_ray_pods_have_the_grace_a_preempted_large_run_needs_for_its_checkpoint() -> None:
    """SIGTERM → SIGKILL after terminationGracePeriodSeconds on every Ray pod; on the head, a preStop
    hook stops the running jobs and Ray's job supervisor waits RAY_JOB_STOP_WAIT_TIME_S after its
    SIGTERM to each driver, inside that grace."""
    for overlay in OVERLAYS:
        cluster = one(objects(overlay), "RayJob")["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]["template"]["spec"]
        pods = [head] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
        assert [p["terminationGracePeriodSeconds"] for p in pods] == [render.STOP_GRACE_S] * len(pods)
        env = {e["name"]: e["value"] for e in head["containers"][0]["env"]}
        assert 0 < int(env["RAY_JOB_STOP_WAIT_TIME_S"]) < render.STOP_GRACE_S
        # Kueue's preemption deletes the cluster: the hook stops the jobs first (test_launchers runs it).
        hook = head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert hook == ["python", "-m", "hptransfer.deploy.prestop"]


def test_base_is_what_render_produces() -> None:
    """k8s/base/rayjob.yaml (spec ConfigMap + RayJob) and raycluster.yaml are render.py's output
    for search_spaces/quickstart.yaml, not hand edits."""
    for fname, (_, objs) in render.base_manifests(REPO).items():
        shipped = [d for d in yaml.safe_load_all((REPO / "k8s" / "base" / fname).read_text()) if d]
        assert shipped == objs, (
            f"k8s/base/{fname} differs from render.py or search_spaces/quickstart.yaml: "
            "python -m hptransfer.deploy.render k8s/base"
        )


def test_gpu_prod_rayjob_equals_hpt_k8s_render() -> None:
    """The gpu-prod patches and `hpt k8s render` with the same numbers give the same RayJob."""
    built = one(objects("gpu-prod"), "RayJob")
    image = one(objects("gpu-prod"), "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]["image"]
    req = render.RayJobRequest(
        study="quickstart",
        spec_yaml=(REPO / "search_spaces" / "quickstart.yaml").read_text(),
        image=image,
        namespace="hptransfer",
        workers=4,
        gpus_per_worker=1,
        cpus_per_worker="8",
        memory_per_worker="48Gi",
        head_cpus="4",
        head_memory="16Gi",
    )
    assert built == render.render_rayjob(req)
    assert one(objects("gpu-prod"), "ConfigMap", req.spec_configmap) == render.render_spec_configmap(req)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        [
            "--image",
            "reg.example/hpt:1",
            "--namespace",
            "team-a",
            "--workers",
            "3",
            "--gpus-per-worker",
            "2",
            "--cpus-per-worker",
            "16",
            "--memory-per-worker",
            "96Gi",
            "--name",
            "big-study",
        ],
    ],
)
def test_hpt_k8s_render_output_validates(flags: list[str], tmp_path: Path) -> None:
    out = tmp_path / "rayjob.yaml"
    spec = REPO / "search_spaces" / "quickstart.yaml"
    result = CliRunner().invoke(deploy_cli.app, ["render", str(spec), "--out", str(out), *flags])
    assert result.exit_code == 0, result.output
    objs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert [o["kind"] for o in objs] == ["ConfigMap", "RayJob"], "ConfigMap first: apply order"
    cm, job = objs
    assert not [e for o in objs for e in schema_errors(o)], [e for o in objs for e in schema_errors(o)]
    assert not security_problems(objs, set())
    assert not [p for w, argv in entrypoints([job]) for p in command_problems(argv, w)] + spec_mount_problems(objs)
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    if flags:
        assert job["metadata"] == {**job["metadata"], "name": "big-study", "namespace": "team-a"}
        assert cm["metadata"]["name"] == "big-study-spec" and cm["metadata"]["namespace"] == "team-a"
        assert workers["replicas"] == 3 and workers["groupName"] == "gpu"
        assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert workers["template"]["spec"]["containers"][0]["image"] == "reg.example/hpt:1"
    else:  # defaults: the same objects as the shipped base
        assert objs == render.base_manifests(REPO)["rayjob.yaml"][1]
    # stdout form is the same documents
    printed = CliRunner().invoke(deploy_cli.app, ["render", str(spec), *flags])
    assert [d for d in yaml.safe_load_all(printed.stdout) if d] == objs


def test_hpt_k8s_render_names_every_bad_flag(tmp_path: Path) -> None:
    broken = tmp_path / "elsewhere.yaml"
    broken.write_text("{}\n")
    result = CliRunner().invoke(
        deploy_cli.app,
        [
            "render",
            str(broken),
            "--workers",
            "0",
            "--namespace",
            "Team_A",
            "--memory-per-worker",
            "4GB",
            "--image",
            "Not An Image",
            "--queue",
            "Team_Q",
            "--active-deadline-seconds",
            "-5",
        ],
        env={"COLUMNS": "1000"},  # Rich's error box would wrap a long tmp path mid-name
    )
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    for needle in (
        "SPEC",
        "elsewhere.yaml",
        "name",
        "--workers",
        "--namespace",
        "'Team_A'",
        "--memory-per-worker",
        "'4GB'",
        "--image",
        "'Not An Image'",
        "@sha256",
        "--queue",
        "'Team_Q'",
        "--active-deadline-seconds",
    ):
        assert needle in text, f"{needle!r} missing from: {text}"


def _spec_file(tmp_path: Path, file_name: str, study: str) -> Path:
    """The quickstart spec under another file name and study name, outside search_spaces/."""
    data = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    data["name"] = study
    path = tmp_path / file_name
    path.write_text(yaml.safe_dump(data))
    return path


def test_render_names_the_study_by_the_spec_name_not_the_file(tmp_path: Path) -> None:
    """Any spec, anywhere (no image rebuild): it travels in the ConfigMap; its `name` is the study."""
    spec = _spec_file(tmp_path, "draft-v2 (copy).yaml", "Lr_Scan.2")
    r = CliRunner().invoke(deploy_cli.app, ["render", str(spec)])
    assert r.exit_code == 0, r.output
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    cm, job = objs
    assert job["metadata"]["name"] == "hpt-lr-scan-2" and cm["metadata"]["name"] == "hpt-lr-scan-2-spec"
    assert cm["data"] == {"Lr_Scan.2.yaml": spec.read_text()}
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[2] == f"{render.SPEC_MOUNT}/Lr_Scan.2.yaml" and "/studies/Lr_Scan.2" in argv
    assert "draft" not in r.stdout
    for o in objs:
        assert o["metadata"]["labels"]["hptransfer.dev/study"] == "Lr_Scan.2"
    assert not [e for o in objs for e in schema_errors(o)] and not spec_mount_problems(objs)


def test_render_refuses_a_study_name_that_is_no_label_value(tmp_path: Path) -> None:
    spec = _spec_file(tmp_path, "ok.yaml", "trailing.")  # valid as a folder, not as a label value
    r = CliRunner().invoke(deploy_cli.app, ["render", str(spec)])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "'trailing.'" in text and "name" in text, text


def test_kueue_queue_label_and_suspended_rayjob(tmp_path: Path) -> None:
    spec = REPO / "search_spaces" / "dp-finetune.yaml"
    r = CliRunner().invoke(deploy_cli.app, ["render", str(spec), "--queue", "team-a", "--active-deadline-seconds", "600"])
    assert r.exit_code == 0, r.output
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    job = one(objs, "RayJob")
    assert job["metadata"]["labels"][render.KUEUE_QUEUE_LABEL] == "team-a"
    assert job["spec"]["suspend"] is True and job["spec"]["activeDeadlineSeconds"] == 600
    assert not [e for o in objs for e in schema_errors(o)] and not security_problems(objs, set())
    plain = [
        d
        for d in yaml.safe_load_all(
            CliRunner().invoke(deploy_cli.app, ["render", str(spec), "--active-deadline-seconds", "0"]).stdout
        )
        if d
    ]
    plain_job = one(plain, "RayJob")
    assert render.KUEUE_QUEUE_LABEL not in plain_job["metadata"]["labels"]
    assert "suspend" not in plain_job["spec"] and "activeDeadlineSeconds" not in plain_job["spec"]
    # the schema would catch a wrong type: activeDeadlineSeconds is an integer, suspend a boolean
    broken = copy.deepcopy(job)
    broken["spec"]["suspend"], broken["spec"]["activeDeadlineSeconds"] = "yes", "10m"
    assert len(schema_errors(broken)) == 2, schema_errors(broken)


def test_dry_run_prints_every_manifest_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "rayjob.yaml"
    r = CliRunner().invoke(
        deploy_cli.app, ["render", str(REPO / "search_spaces" / "quickstart.yaml"), "--out", str(out), "--dry-run"]
    )
    assert r.exit_code == 0, r.output
    assert not out.exists() and not out.parent.exists()
    assert [d["kind"] for d in yaml.safe_load_all(r.stdout) if d] == ["ConfigMap", "RayJob"]
    assert "not written" in r.stderr


def test_image_may_be_pinned_by_digest() -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    for image in (f"ghcr.io/hptransfer/hptransfer@{digest}", f"localhost:5000/hpt:0.1.0-cpu@{digest}", "hptransfer"):
        req = render.RayJobRequest(study="s", spec_yaml="name: s\n", image=image)
        pods = [t for _, t in pod_templates(render.render_rayjob(req))]
        assert {c["image"] for pod in pods for c in containers(pod)} == {image}
    for bad in ("ghcr.io/hpt@sha256:abc", "Upper/Case:1", "a b", "hpt:"):
        with pytest.raises(ValueError, match="not an image reference"):
            render.RayJobRequest(study="s", spec_yaml="", image=bad)


def test_hpt_k8s_is_registered_on_the_hpt_app() -> None:
    assert "k8s" in real_verbs()
    result = CliRunner().invoke(
        __import__("hptransfer.cli", fromlist=["app"]).app, ["k8s", "render", str(REPO / "search_spaces" / "quickstart.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout) if d] == ["ConfigMap", "RayJob"]


def test_dockerfile_builds_what_the_manifests_assume() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert f"WORKDIR {render.IMAGE_ROOT}" in lines
    assert f"USER {render.RUN_AS_USER}:{render.RUN_AS_USER}" in lines, "pods run as this uid"
    assert "COPY search_spaces ./search_spaces" in lines, "specs are read from the image"
    assert re.search(r"pip install -c constraints.txt \. ", text), "installs the project with pip"
    assert "TORCH_INDEX_URL" in text and "ray[default]" in text
    ignore = (REPO / ".dockerignore").read_text().split()
    for needed in ("pyproject.toml", "constraints.txt", "platform", "search_spaces", "launchers", "README.md"):
        assert f"!{needed}" in ignore, f".dockerignore must let {needed} into the build context"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mlflow_deployment_command_serves_and_refuses_foreign_hosts(tmp_path: Path) -> None:
    """Run the cpu-dev MLflow container's own command, env and Secret value here (paths under
    /mlflow moved to tmp, port made free): it must serve its in-cluster Service name and refuse
    any other Host header."""
    import os
    import signal
    import socket
    import subprocess
    import time

    import requests

    objs = objects("cpu-dev")
    pod = one(objs, "Deployment", "mlflow")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    secret = one(objs, "Secret")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def local(v: str) -> str:
        return (
            v.replace("/mlflow/", f"{tmp_path}/")
            .replace("--port=5000", f"--port={port}")
            .replace("--host=0.0.0.0", "--host=127.0.0.1")
        )

    dep = one(objs, "Deployment", "mlflow")
    pod_env = {k: local(v) for k, v in _container_env(dep, c, secret).items()}
    env = {**os.environ, "HOME": str(tmp_path), **pod_env}
    args = [local(_expand(a, pod_env)) for a in c["args"]]
    argv = [str(Path(sys.executable).parent / c["command"][0]), *c["command"][1:], *args]
    proc = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "mlflow server never became healthy"
            time.sleep(0.5)
        api = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
        for host in ("mlflow:5000", "mlflow.hptransfer-dev.svc.cluster.local:5000", "localhost:5000"):
            assert requests.get(api, headers={"Host": host}, timeout=10).status_code == 200, host
        for host in ("attacker.example:5000", "mlflow.attacker.example:5000", "mlflow.attacker.example"):
            assert requests.get(api, headers={"Host": host}, timeout=10).status_code == 403, host
        assert (tmp_path / "mlflow.db").is_file(), "backend store from the Secret's URI"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------- per-cluster settings


def _helm_install_namespaces() -> list[str]:
    """`--namespace` of every `helm install kuberay-operator` command in the READMEs."""
    found = []
    for doc in (REPO / "README.md", REPO / "k8s" / "README.md"):
        for cmd in re.findall(r"`(helm install kuberay-operator[^`]*)`", doc.read_text()):
            argv = shlex.split(cmd)
            assert "--namespace" in argv, f"{doc.name}: `{cmd}` must say --namespace (the NetworkPolicy admits one)"
            found.append(argv[argv.index("--namespace") + 1])
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_operator_namespace_is_one_value_for_readme_and_networkpolicy(overlay: str) -> None:
    setting = overlay_settings(overlay)["kuberay-operator-namespace"]
    assert operator_namespaces(objects(overlay)) == {setting}
    installs = _helm_install_namespaces()
    assert installs and set(installs) == {setting}, (
        f"README installs the operator in {installs}, the {overlay} NetworkPolicy admits it from {setting!r}"
    )


def _overlay_copy(tmp_path: Path, overlay: str, edit) -> list[dict[str, Any]]:
    """Build a copy of k8s/ whose overlay kustomization.yaml went through `edit(text) -> text`."""
    root = tmp_path / "k8s"
    shutil.copytree(REPO / "k8s", root)
    kz = root / "overlays" / overlay / "kustomization.yaml"
    text = kz.read_text()
    changed = edit(text)
    assert changed != text, "the edit must change the overlay"
    kz.write_text(changed)
    return kustomize_build(root / "overlays" / overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_reach_the_objects(overlay: str, tmp_path: Path) -> None:
    """The wiring is real, not a coincidence of equal literals: change a setting, the object follows."""
    objs = _overlay_copy(
        tmp_path, overlay, lambda t: t.replace("kuberay-operator-namespace=kuberay-system", "kuberay-operator-namespace=ray-ops")
    )
    assert operator_namespaces(objs) == {"ray-ops"}
    assert not [o for o in objs if o["metadata"]["name"] == "hptransfer-settings"], "local-config stays out"
    assert not network_problems(objs, "ray-ops")


def test_studies_storage_class_is_set_per_overlay(tmp_path: Path) -> None:
    gpu = one(objects("gpu-prod"), "PersistentVolumeClaim", "hpt-studies")["spec"]
    assert gpu["accessModes"] == ["ReadWriteMany"]
    assert gpu["storageClassName"] == overlay_settings("gpu-prod")["studies-storage-class"]
    assert "storageClassName" not in one(objects("cpu-dev"), "PersistentVolumeClaim", "hpt-studies")["spec"]
    objs = _overlay_copy(
        tmp_path,
        "gpu-prod",
        lambda t: t.replace(
            "studies-storage-class=" + overlay_settings("gpu-prod")["studies-storage-class"], "studies-storage-class=efs-sc"
        ),
    )
    assert one(objs, "PersistentVolumeClaim", "hpt-studies")["spec"]["storageClassName"] == "efs-sc"
    assert not [e for o in objs for e in schema_errors(o)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_image_digest_is_settable_per_overlay(overlay: str, tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    objs = _overlay_copy(tmp_path, overlay, lambda t: re.sub(r"# digest: sha256:<[^>]*>", f"digest: {digest}", t))
    images = {c["image"] for o in objs for _, pod in pod_templates(o) for c in containers(pod)}
    assert images and all(i.endswith("@" + digest) for i in images), images
    kinds = {o["kind"] for o in objs for _ in pod_templates(o)}
    assert {"RayJob", "RayCluster", "Deployment", "Job"} <= kinds


# ---------------------------------------------------------------- MLflow's allowed hosts


def _expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion in command/args (`$$` escapes; unknown names stay)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value
    )


def _container_env(obj: dict[str, Any], c: dict[str, Any], secret: dict[str, Any] | None = None) -> dict[str, str]:
    """Plain values, downward-API fieldRefs (metadata.namespace) and Secret keys, as the kubelet sets them."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        src = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)
        elif src.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = obj["metadata"]["namespace"]
        elif "secretKeyRef" in src and secret is not None:
            assert src["secretKeyRef"]["name"] == secret["metadata"]["name"]
            env[e["name"]] = base64.b64decode(secret["data"][src["secretKeyRef"]["key"]]).decode()
    return env


def mlflow_allowed_hosts(objs: list[dict[str, Any]]) -> list[str]:
    dep = one(objs, "Deployment", "mlflow")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = _container_env(dep, c)
    args = [_expand(a, env) for a in c["args"]]
    found = [a.split("=", 1)[1] for a in args if a.startswith("--allowed-hosts=")]
    assert len(found) == 1, args
    return found[0].split(",")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mlflow_allowed_hosts_are_exact(overlay: str) -> None:
    """MLflow's own host check, on the list the pod would get: in-cluster names pass, names that
    merely start with `mlflow.` (DNS rebinding) do not; no wildcard in any host name."""
    from mlflow.server.security_utils import is_allowed_host_header

    objs = objects(overlay)
    ns = one(objs, "Namespace")["metadata"]["name"]
    hosts = mlflow_allowed_hosts(objs)
    assert not [h for h in hosts if "$(" in h], f"unexpanded variable in {hosts}"
    for h in hosts:
        name, _, port = h.rpartition(":")
        assert "*" not in name and (port == "5000" or (port == "*" and name in ("localhost", "127.0.0.1"))), h
    for ok in (
        "mlflow:5000",
        f"mlflow.{ns}:5000",
        f"mlflow.{ns}.svc:5000",
        f"mlflow.{ns}.svc.cluster.local:5000",
        "localhost:5000",
        "127.0.0.1:8080",
    ):
        assert is_allowed_host_header(hosts, ok), ok
    for bad in (
        "mlflow.attacker.example",
        "mlflow.attacker.example:5000",
        "attacker.example:5000",
        f"mlflow.{ns}.attacker.example:5000",
        "mlflow",
        f"mlflow.other-{ns}:5000",
        "localhost.attacker.example",
    ):
        assert not is_allowed_host_header(hosts, bad), bad
