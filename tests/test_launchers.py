"""launchers/: every entry point is run. The Ray one against a real two-node Ray cluster on
this machine (`ray start` head with dashboard + `ray start` worker), through the Ray Jobs API."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
import yaml

from hptransfer.deploy import ray_jobs
from test_k8s_manifests import command_problems, schema_errors, security_problems, spec_mount_problems

from conftest import free_port

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "quickstart.yaml"
PY = sys.executable
# The venv's bin first, as in an activated venv: jobs on the cluster call `hpt`.
BASE_ENV = {
    **os.environ,
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "PATH": f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}


def run_launcher(
    name: str, *args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, str(REPO / "launchers" / name), *args], cwd=cwd, env=env or BASE_ENV, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------- fast: no cluster


def test_local_launcher_dry_run_prints_the_hpt_run_it_would_make() -> None:
    r = run_launcher("local.py", str(SPEC.relative_to(REPO)), "--dry-run")
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stderr.strip().splitlines()[-1])
    assert argv == ["hpt", "run", "search_spaces/quickstart.yaml", "--study-dir", "studies/quickstart"]
    assert not command_problems(argv, "launchers/local.py"), command_problems(argv, "launchers/local.py")


@pytest.mark.slow
def test_local_launcher_runs_hpt_run(hpt_run_study: dict, tmp_path: Path) -> None:
    """The launcher itself, no dry run, cheaply: on a copy of the session's finished study, the
    `hpt --verbose run` it makes in its own process resumes every stage — the sweep keeps its trials,
    the finished large run is kept as it is (no Ray Train or DeepSpeed start) — and writes the
    report again. `--verbose` brings Ray's own output to the console (test_dp_finetune checks Ray
    Train's workers' lines under --verbose)."""
    study = shutil.copytree(hpt_run_study["dir"], tmp_path / "study")  # the shared study stays as it is
    report, metrics = study / "report" / "index.html", study / "train" / "train_metrics.json"
    report.unlink()
    before_bytes = metrics.read_bytes()
    r = run_launcher("local.py", str(hpt_run_study["spec"]), "--study-dir", str(study), "--verbose", timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "hpt " + shlex.join(["--verbose", "run", str(hpt_run_study["spec"]), "--study-dir", str(study)]) in r.stderr
    assert "[sweep] 6/6 trials kept from the earlier run: nothing left to train" in r.stdout, r.stdout[-3000:]
    assert "large run: already finished for this plan" in r.stdout, r.stdout[-3000:]
    assert "study done" in r.stdout and report.stat().st_size > 1000
    assert metrics.read_bytes() == before_bytes  # the finished run's record untouched
    # --verbose: Ray's own driver output on the console, as plain text
    console = r.stdout + r.stderr
    assert "Started a local Ray instance" in console, console[-3000:]
    assert "\x1b[" not in console


def test_kubernetes_launcher_without_a_cluster_writes_a_valid_rayjob(tmp_path: Path) -> None:
    env = {**BASE_ENV, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}  # no context: do not apply
    r = run_launcher("kubernetes.py", str(SPEC), "--image", "reg.example/hpt:1", "--workers", "2", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "studies" / "quickstart" / "rayjob.yaml"
    assert "no kubectl context" in r.stderr and str(out.relative_to(tmp_path)) in r.stderr
    objs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert [o["kind"] for o in objs] == ["ConfigMap", "RayJob"]
    assert not [e for o in objs for e in schema_errors(o)] and not security_problems(objs, set())
    assert not spec_mount_problems(objs)
    job = objs[1]
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2


def _renamed_spec(folder: Path, file_name: str, study: str) -> Path:
    data = yaml.safe_load(SPEC.read_text())
    data["name"] = study
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file_name).write_text(yaml.safe_dump(data))
    return folder / file_name


def test_kubernetes_launcher_names_the_study_by_the_spec_name(tmp_path: Path) -> None:
    spec = _renamed_spec(tmp_path / "specs", "scratch-file.yaml", "widthscan")
    env = {**BASE_ENV, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    r = run_launcher("kubernetes.py", str(spec), "--queue", "research", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "studies" / "widthscan" / "rayjob.yaml"
    objs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    job = objs[1]
    assert job["metadata"]["name"] == "hpt-widthscan" and "/studies/widthscan" in job["spec"]["entrypoint"]
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert "scratch-file" not in out.read_text() and not (tmp_path / "studies" / "scratch-file").exists()


def test_ray_cluster_launcher_refuses_a_spec_outside_the_project(tmp_path: Path) -> None:
    outside = tmp_path / "search_spaces" / "mine.yaml"
    outside.parent.mkdir()
    outside.write_text("name: mine\n")
    r = run_launcher("ray_cluster.py", str(outside), "--address", "http://127.0.0.1:1", "--working-dir", str(REPO))
    assert r.returncode == 2
    assert "outside the project" in r.stderr and "working_dir" in r.stderr


def test_runtime_env_carries_project_and_package_not_venv() -> None:
    env = ray_jobs.runtime_env(REPO, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
    assert env["working_dir"] == str(REPO)
    assert env["py_modules"] == [str(REPO / "platform" / "hptransfer")]
    assert {".venv/", ".git/", "studies/", ".env", "*.pem", "*.db", ".ray/"} <= set(env["excludes"])
    assert env["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert ray_jobs.spec_in_project(SPEC, REPO) == "search_spaces/quickstart.yaml"


@pytest.mark.parametrize("verb", ["run", "sweep"])
def test_default_entrypoint_is_a_real_hpt_command_that_joins_the_cluster(verb: str) -> None:
    cmd = ray_jobs.hpt_entrypoint(
        verb, "search_spaces/quickstart.yaml", "--tracking-uri", "http://m:5000", study_dir="/studies/quickstart"
    )
    argv = shlex.split(cmd)
    assert argv[:3] == ["hpt", verb, "search_spaces/quickstart.yaml"] and argv[-2:] == ["--address", "auto"]
    assert argv[argv.index("--study-dir") + 1] == "/studies/quickstart"
    assert not command_problems(argv, "ray_cluster.py"), command_problems(argv, "ray_cluster.py")
    own = shlex.split(ray_jobs.hpt_entrypoint(verb, "s.yaml", "--study-dir=/mine", study_dir="/studies/x"))
    assert "/studies/x" not in own and "--study-dir=/mine" in own, "a --study-dir passed through wins"


def test_ray_cluster_launcher_defaults_the_study_to_the_shared_volume(tmp_path: Path) -> None:
    """Not the job's temporary working_dir: /studies/<spec name> (the k8s RayCluster's shared PVC)."""
    spec = _renamed_spec(tmp_path / "search_spaces", "scratch-file.yaml", "widthscan")
    r = run_launcher(
        "ray_cluster.py", str(spec), "--address", "http://127.0.0.1:1", "--verb", "sweep", "--working-dir", str(tmp_path)
    )
    assert "study folder on the cluster: /studies/widthscan" in r.stderr, r.stderr
    assert r.returncode == 1 and "Failed to connect" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_launcher(
        "ray_cluster.py",
        str(spec),
        "--address",
        "http://127.0.0.1:1",
        "--study-root",
        "/mnt/shared",
        "--working-dir",
        str(tmp_path),
    )
    assert "study folder on the cluster: /mnt/shared/widthscan" in r.stderr, r.stderr


# ---------------------------------------------------------------- slow: a real 2-node Ray cluster


def _ports() -> list[str]:
    # Every port explicit: head and worker share this machine (and other engineers' Ray may too).
    args = []
    for flag in (
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    ):
        args += [flag, str(free_port())]
    return args


class LoopbackCluster:
    """Head (with dashboard / Jobs API) + one worker node, each 1 CPU, token auth on, all state
    under one private temp dir. `stop()` ends exactly the processes of this cluster: those whose
    command line or environment names that dir (never `ray stop`, which ends every Ray here)."""

    def __init__(self) -> None:
        # Short path: Ray's Unix sockets live under it (limit ~107 characters).
        self.root = Path(tempfile.mkdtemp(prefix="hpt-k8s-", dir="/tmp"))
        self.token = secrets.token_hex(32)
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.env = {**BASE_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}
        self.address = f"http://127.0.0.1:{self.dashboard_port}"

    def _ray_start(self, temp_dir: Path, *args: str) -> None:
        # One temp dir per node, as on separate machines: nodes sharing one would share
        # runtime_resources/, and a node dropping an unused working_dir would delete it under
        # a driver still running on the other node.
        ray = str(Path(PY).parent / "ray")
        r = subprocess.run(
            [
                ray,
                "start",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                "--object-store-memory=100000000",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
                *_ports(),
                *args,
            ],
            env={**self.env, "RAY_TMPDIR": str(temp_dir)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, f"ray start {args} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"

    def start(self) -> None:
        self._ray_start(
            self.root / "head",
            "--head",
            f"--port={self.gcs_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={free_port()}",
        )
        self._ray_start(self.root / "worker", f"--address=127.0.0.1:{self.gcs_port}")
        deadline = time.monotonic() + 90
        while len(self.alive_nodes()) < 2:
            assert time.monotonic() < deadline, f"2 nodes never came up: {self.alive_nodes()}"
            time.sleep(1)

    def alive_nodes(self) -> list[str]:
        """Node IDs the cluster reports ALIVE, asked through the dashboard's state API."""
        try:
            r = requests.get(f"{self.address}/api/v0/nodes", timeout=10, headers={"Authorization": f"Bearer {self.token}"})
            rows = r.json()["data"]["result"]["result"]
        except (requests.RequestException, KeyError, ValueError):
            return []
        return [n["node_id"] for n in rows if n["state"] == "ALIVE"]

    def processes(self) -> list[psutil.Process]:
        mine, marker = [], str(self.root)
        for p in psutil.process_iter(["cmdline"]):
            try:
                if marker in " ".join(p.info["cmdline"] or []) or p.environ().get("RAY_TMPDIR", "").startswith(marker):
                    mine.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return [p for p in mine if p.pid != os.getpid()]

    def stop(self) -> None:
        procs = self.processes()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:  # gcs_server and raylet can ignore SIGTERM for a while
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    c = LoopbackCluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()
    assert not c.processes(), "processes of the test cluster survived stop()"


# Runs as the job's driver: tasks spread over both nodes, each reporting its node, whether the
# working_dir (the project) carried the spec there, and where hptransfer was imported from.
PROBE = """
import os, sys, ray
ray.init()
@ray.remote(num_cpus=1, scheduling_strategy="SPREAD")
def probe():
    import time, hptransfer
    time.sleep(2)
    return (ray.get_runtime_context().get_node_id(), os.path.isfile("search_spaces/quickstart.yaml"),
            hptransfer.__file__)
rows = ray.get([probe.remote() for _ in range(4)])
for r in rows: print("PROBE", *r)
nodes = {r[0] for r in rows}
print("NODES", len(nodes))
sys.exit(0 if len(nodes) == 2 and all(r[1] for r in rows) else 5)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_cluster_launcher_on_a_two_node_cluster(cluster: LoopbackCluster) -> None:
    nodes_before = set(cluster.alive_nodes())
    assert len(nodes_before) == 2
    env = cluster.env  # the launcher is a client only: no RAY_TMPDIR of its own needed
    ok = run_launcher(
        "ray_cluster.py",
        str(SPEC),
        "--address",
        cluster.address,
        "--entrypoint",
        shlex.join([PY, "-c", PROBE]),
        env=env,
        timeout=300,
    )
    out = ok.stdout + ok.stderr
    assert ok.returncode == 0, out[-6000:]
    assert "NODES 2" in out and "SUCCEEDED (exit 0)" in out
    probes = [ln.split() for ln in out.splitlines() if ln.startswith("PROBE ")]
    assert {p[1] for p in probes} == nodes_before, "tasks ran on both nodes of this cluster"
    assert all(p[2] == "True" for p in probes), "the spec travelled with the working_dir"
    # the package came from the job's py_modules upload, not the venv's editable install
    assert all("runtime_resources" in p[3] for p in probes), probes

    failing = run_launcher(
        "ray_cluster.py",
        str(SPEC),
        "--address",
        cluster.address,
        "--entrypoint",
        shlex.join([PY, "-c", "import sys; print('boom'); sys.exit(3)"]),
        env=env,
        timeout=300,
    )
    assert failing.returncode == 3, failing.stdout[-3000:] + failing.stderr[-3000:]
    assert "boom" in failing.stdout and "FAILED (exit 3)" in failing.stderr
    assert set(cluster.alive_nodes()) == nodes_before, "both nodes still alive after the jobs"


def _tiny_project(root: Path) -> Path:
    """A copy of the project whose only spec is the quickstart cut to 2 widths x 2 LRs x 10 steps
    (about a minute on 2 CPUs): the real `hpt sweep`, small enough for CI."""
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(
        REPO / "platform" / "hptransfer", root / "platform" / "hptransfer", ignore=shutil.ignore_patterns("__pycache__")
    )
    spec = yaml.safe_load(SPEC.read_text())
    spec["name"] = "loopback"
    spec["sweep"]["widths"] = spec["sweep"]["widths"][:2]
    spec["sweep"]["grid"] = {"lr": [0.01, 0.1]}
    spec["sweep"]["steps"] = 10
    spec["sweep"]["seeds"] = [0]
    spec["sweep"]["noise_seeds"] = 0  # the grid only: 4 trials over the two nodes
    spec["data"]["max_files"] = 50
    (root / "search_spaces").mkdir()
    (root / "search_spaces" / "loopback.yaml").write_text(yaml.safe_dump(spec))
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hpt_sweep_through_the_launcher_runs_trials_on_both_nodes(cluster: LoopbackCluster, tmp_path: Path) -> None:
    import mlflow

    project = _tiny_project(tmp_path / "project")
    study = tmp_path / "study"  # same filesystem for both nodes, like a shared PVC
    tracking = f"sqlite:///{study / 'mlflow.db'}"
    r = run_launcher(
        "ray_cluster.py",
        str(project / "search_spaces" / "loopback.yaml"),
        "--address",
        cluster.address,
        "--verb",
        "sweep",
        "--working-dir",
        str(project),
        "--tracking-uri",
        tracking,
        "--study-dir",
        str(study),
        env=cluster.env,
        timeout=500,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-8000:]
    assert "--address auto" in out and "SUCCEEDED (exit 0)" in out
    import pandas as pd

    table = pd.read_csv(study / "sweep_results.csv")
    assert len(table) == 4 and set(table["status"]) == {"ok"}, table
    # Trials are Tune actors: the cluster's state API says where each one ran.
    actors = requests.get(
        f"{cluster.address}/api/v0/actors",
        params={"limit": 10000, "detail": "true"},
        headers={"Authorization": f"Bearer {cluster.token}"},
        timeout=30,
    ).json()
    rows = actors["data"]["result"]["result"]
    trial_nodes = {a["node_id"] for a in rows if "ImplicitFunc" in a["class_name"]}
    assert trial_nodes == set(cluster.alive_nodes()), (
        f"trials ran on {trial_nodes}, cluster has {cluster.alive_nodes()}; "
        f"actor classes: {sorted({a['class_name'] for a in rows})}"
    )
    client = mlflow.MlflowClient(tracking)
    runs = [run for e in client.search_experiments() for run in client.search_runs([e.experiment_id])]
    parents = [x for x in runs if "mlflow.parentRunId" not in x.data.tags]
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 4, [x.info.run_name for x in runs]
    assert all("val_loss" in c.data.metrics for c in children)


# A driver that, like `hpt train`, spends a moment on SIGTERM (its checkpoint) before exiting 75.
STOPPABLE_DRIVER = """
import pathlib, signal, sys, time
marker = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    time.sleep(1)
    marker.write_text("SIGTERM handled")
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
marker.write_text("running")
time.sleep(300)
"""

# Submits that driver as a Ray job, waits for it to run, then runs the head pod's preStop hook.
PRESTOP_PROBE = """
import pathlib, sys, time
from ray.job_submission import JobSubmissionClient
from hptransfer.deploy.prestop import stop_running_jobs
address, entrypoint, marker = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
job = JobSubmissionClient(address).submit_job(entrypoint=entrypoint)
deadline = time.time() + 180
while not (marker.exists() and marker.read_text() == "running"):
    assert time.time() < deadline, "the job never started"
    time.sleep(0.2)
print("FINAL", stop_running_jobs(address, wait_s=60)[job])
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_head_prestop_hook_gives_a_running_driver_its_sigterm(cluster: LoopbackCluster, tmp_path: Path) -> None:
    """Kueue's preemption deletes the RayCluster: the head's preStop hook (deploy/prestop.py, set
    by render.py) stops every running Ray job first, so the driver gets SIGTERM and its time."""
    marker = tmp_path / "driver_state"
    r = subprocess.run(
        [PY, "-c", PRESTOP_PROBE, cluster.address, shlex.join([PY, "-c", STOPPABLE_DRIVER, str(marker)]), str(marker)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FINAL STOPPED" in r.stdout, r.stdout[-3000:]
    assert marker.read_text() == "SIGTERM handled"


def _small_plan(study: str, steps: int, **train):
    """A 2-worker µP Llama plan of the e2e spec's model at width 64 (1 CPU a worker)."""
    from hptransfer.plan import TargetShape, TransferPlan
    from hptransfer.spec import parse_spec

    from conftest import e2e_spec_dict

    spec = parse_spec(e2e_spec_dict())
    return TransferPlan(
        study=study,
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=steps, batch_size=8, seq_len=16),
        hyperparameters={"lr": 0.03, "warmup_steps": 2},
        data=spec.data,
        train=spec.train.model_copy(update=train),
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_large_run_across_two_nodes_has_the_losses_of_one_node(
    cluster: LoopbackCluster, hpt_run_study, tmp_path: Path
) -> None:
    """Issue 39 item 3: the session's `hpt run` plan (conftest `hpt_run_study`: 2 Ray Train workers,
    DeepSpeed ZeRO-1, gloo, trained there on a single-node local Ray) trained again by `hpt train` on
    this module's two-node cluster — 1 CPU a node, so one rank on each; the ranks' own record
    (train_metrics.json's `placement`) names both of the cluster's nodes: the per-step losses agree
    with the single-node run's (1e-4 relative; measured with a fresh single-node run beside it:
    identical, 0.0) and the curve trains."""
    one = json.loads((hpt_run_study["dir"] / "train" / "train_metrics.json").read_text())
    study = tmp_path / "two_nodes"
    study.mkdir()
    shutil.copy(hpt_run_study["dir"] / "transfer_plan.yaml", study / "transfer_plan.yaml")
    r = subprocess.run(
        [PY, "-m", "hptransfer", "train", str(study / "transfer_plan.yaml"), "--address", f"127.0.0.1:{cluster.gcs_port}"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "large run: its 2 ranks ran on 2 nodes" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    two = json.loads((study / "train" / "train_metrics.json").read_text())
    across, alone = two["final"]["placement"], one["final"]["placement"]
    assert across["nodes"] == 2 and {x["node_id"] for x in across["ranks"]} == set(cluster.alive_nodes()), across
    assert alone["nodes"] == 1 and len(alone["ranks"]) == 2, alone
    a, b = ([h["train_loss"] for h in m["history"]] for m in (two, one))
    assert len(a) == len(b) == one["final"]["step"] and b[-1] < b[0] - 0.3, b  # it trains: equal flat curves prove nothing
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"two nodes vs one: largest per-step relative loss difference {worst:.2e}")
    assert worst < 1e-4, (a, b)
    assert two["final"]["val_loss"] == pytest.approx(one["final"]["val_loss"], rel=1e-4)


MULTINODE_FAULTS = pytest.mark.skipif(
    os.environ.get("HPT_MULTINODE_FAULTS") != "1",
    reason="~3 min and it kills a worker node: run with HPT_MULTINODE_FAULTS=1 (kept out of CI's budget)",
)


def _lose_the_worker_node_mid_run(cluster: LoopbackCluster, study: Path, plan) -> tuple[int, str]:
    """`hpt train` of `plan` on the cluster (one rank a node); once a checkpoint of step ≥ 3 is on disk
    the worker node's processes are killed. Returns the driver's exit status and output."""
    from hptransfer.plan import save_plan

    save_plan(plan, study / "transfer_plan.yaml")
    env = {**cluster.env, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
    p = subprocess.Popen(
        [PY, "-m", "hptransfer", "train", str(study / "transfer_plan.yaml"), "--address", f"127.0.0.1:{cluster.gcs_port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    progress = study / "train" / "progress.json"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if json.loads(progress.read_text()).get("checkpoint_step", 0) >= 3:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    worker_node = str(cluster.root / "worker")
    ranks = [int(f.read_text()) for f in (study / "train" / "pids").glob("rank*")]
    on_worker = [psutil.Process(pid).environ().get("RAY_TMPDIR", "").startswith(worker_node) for pid in ranks]
    assert sorted(on_worker) == [False, True], "one rank on each node"
    for proc in cluster.processes():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.environ().get("RAY_TMPDIR", "").startswith(worker_node) or worker_node in " ".join(proc.cmdline()):
                proc.kill()
    out, _ = p.communicate(timeout=400)
    return p.returncode, out


@pytest.mark.slow
@pytest.mark.timeout(600)
@MULTINODE_FAULTS
def test_a_lost_worker_node_lets_an_elastic_large_run_go_on_with_one_worker(tmp_path: Path) -> None:
    """Issue 39 item 2: with train.min_workers 1 (Ray Train's elastic ScalingConfig((1, 2))) the same
    loss of the worker node does not stop the run: Ray Train restarts the group with the 1 worker the
    head node can place, which resumes from the 2-rank checkpoint through a DeepSpeed universal
    checkpoint (said in one line) and finishes; exit 0. Its own cluster: this one loses a node."""
    c = LoopbackCluster()
    try:
        c.start()
        plan = _small_plan("elastic", 40, checkpoint_every=1, max_failures=1, min_workers=1)
        code, out = _lose_the_worker_node_mid_run(c, tmp_path / "study", plan)
    finally:
        c.stop()
    assert code == 0, out[-4000:]
    assert "1-2 workers (elastic)" in out, out[-3000:]
    assert "was written by 2 workers, this group has 1: resuming from its DeepSpeed universal checkpoint" in out, out[-3000:]
    final = json.loads((tmp_path / "study" / "train" / "train_metrics.json").read_text())["final"]
    assert final["status"] == "ok" and final["step"] == 40 and len(final["placement"]["ranks"]) == 1, final


@pytest.mark.slow
@pytest.mark.timeout(600)
@MULTINODE_FAULTS
def test_a_lost_worker_node_stops_the_large_run_with_the_line_that_continues_it(cluster: LoopbackCluster, tmp_path: Path) -> None:
    """The large run's 2 workers on the two nodes (1 CPU each); the worker node's processes killed
    mid-run. Ray Train cannot place 2 workers on what is left: the run stops after
    runner.placement_tries (not hang, as Ray Train V2's unbounded retries did), naming what it needs,
    exit 75. Runs last in this module: the cluster has one node afterwards."""
    plan = _small_plan("lost-node", 40, checkpoint_every=1, max_failures=1)  # it tries to restart
    code, out = _lose_the_worker_node_mid_run(cluster, tmp_path / "study", plan)
    assert code == 75, out[-4000:]
    assert "the cluster could not place its 2 workers × 1 CPU (3 tries; a node lost or preempted?)" in out, out[-3000:]
    assert "--resume" in out and "Traceback" not in out.split("stopped:")[-1]
