"""The DeepSpeed config a plan implies, validated by DeepSpeed's own config class."""

import pytest

from hptransfer.plan import TargetShape, TransferPlan
from hptransfer.spec import parse_spec
from hptransfer.train.dsconfig import PlanError, deepspeed_config, micro_batching

from conftest import tiny_spec_dict


def _plan(**train):
    spec = parse_spec(tiny_spec_dict(train=train))
    return TransferPlan(
        study="t",
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=5, batch_size=12, seq_len=16),
        hyperparameters={"lr": 0.01},
        data=spec.data,
        train=spec.train,
    )


@pytest.mark.parametrize("batch,workers,max_micro,expect", [(12, 2, None, (6, 1)), (12, 3, 2, (2, 2)), (16, 4, 3, (2, 2))])
def test_micro_batching_hits_the_global_batch(batch, workers, max_micro, expect):
    micro, accum = micro_batching(batch, workers, max_micro)
    assert (micro, accum) == expect and micro * accum * workers == batch


def test_config_is_accepted_by_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig

    # Without a process group DeepSpeed sees one rank; the 2-rank config runs in test_pipeline.
    ds = DeepSpeedConfig(deepspeed_config(_plan(zero_stage=2), workers=1, max_micro_batch=4))
    assert ds.zero_optimization_stage == 2 and ds.train_batch_size == 12
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (4, 3)
    assert ds.gradient_clipping == 0.0 and not ds.bfloat16_config.enabled  # as in the sweep: off


def test_indivisible_batch_is_refused_with_the_fix():
    with pytest.raises(PlanError, match="not divisible by train.workers=5"):
        deepspeed_config(_plan(), workers=5)


def test_zero3_with_mup_is_a_valid_deepspeed_config():
    """µP under ZeRO-3 (issue 39): the large run trains the folded plain model, so the stage is the
    user's choice; DeepSpeed's own parser reads it."""
    from deepspeed.runtime.config import DeepSpeedConfig

    plan = _plan(zero_stage=3)
    assert plan.model.parametrization == "mup"
    ds = DeepSpeedConfig(deepspeed_config(plan, workers=1))
    assert ds.zero_optimization_stage == 3 and ds.zero_allow_untested_optimizer


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_to_cpu_is_read_by_deepspeed_as_offload(stage):
    """train.offload: cpu (issue 39): DeepSpeed's own parser sees the optimizer offloaded to the CPU at
    every stage and the parameters too at stage 3, and keeps our torch AdamW (not DeepSpeedCPUAdam)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    ds = DeepSpeedConfig(deepspeed_config(_plan(zero_stage=stage, offload="cpu"), workers=1))
    z = ds.zero_config
    assert z.offload_optimizer is not None and z.offload_optimizer.device == OffloadDeviceEnum.cpu
    assert (z.offload_param is not None and z.offload_param.device == OffloadDeviceEnum.cpu) == (stage == 3)
    assert ds.zero_force_ds_cpu_optimizer is False
    plain = DeepSpeedConfig(deepspeed_config(_plan(zero_stage=stage), workers=1)).zero_config
    assert plain.offload_optimizer is None or plain.offload_optimizer.device == OffloadDeviceEnum.none


def test_offload_without_zero_is_refused_naming_both_fields():
    from hptransfer.errors import SpecError

    with pytest.raises(SpecError) as e:
        _plan(zero_stage=0, offload="cpu")
    assert "train.offload='cpu'" in str(e.value) and "train.zero_stage: 1, 2 or 3" in str(e.value)


def test_a_universal_load_is_read_by_deepspeed_as_one():
    """A checkpoint of another worker count (issue 39): the config asks DeepSpeed to load it as a
    universal checkpoint, which DeepSpeed's own parser reads; otherwise it does not."""
    from deepspeed.runtime.config import DeepSpeedConfig

    assert DeepSpeedConfig(deepspeed_config(_plan(), workers=1, load_universal=True)).load_universal_checkpoint
    assert not DeepSpeedConfig(deepspeed_config(_plan(), workers=1)).load_universal_checkpoint


def test_min_workers_above_workers_is_refused_with_the_fix():
    from hptransfer.errors import SpecError

    with pytest.raises(SpecError) as e:
        _plan(workers=2, min_workers=3)
    assert "train.min_workers=3 is more than train.workers=2" in str(e.value) and "at most 2" in str(e.value)


def test_an_elastic_range_every_count_of_which_must_split_the_batch():
    """batch 12 over 1..5 workers: 5 does not divide it (all such counts named, with a batch that works);
    over 2..4 every count does, and the plain large run's launch accepts it."""
    from hptransfer.train import plain
    from hptransfer.train.dsconfig import check_worker_range

    with pytest.raises(PlanError) as e:
        check_worker_range(_plan(workers=5, min_workers=1))
    assert "not divisible by [5]" in str(e.value) and "1..5" in str(e.value) and "e.g. 60" in str(e.value)
    ok = _plan(workers=4, min_workers=2)
    assert ok.train.worker_range == (2, 4) and "2-4 workers (elastic)" in plain.launch(ok).announce
    with pytest.raises(PlanError, match=r"not divisible by \[5\]"):
        plain.launch(_plan(workers=5, min_workers=4))
