"""The hand-off's optimizer groups in each trainer's own form, checked with that trainer's own code.

`write_trainer_files(DIR/trainers, DIR/model, optimizer.json's dict)` writes

    torchtitan/hpt_handoff_config.py   torchtitan 0.3 `config_registry` module: `hpt_handoff()` returns a
                                       `Trainer.Config` with regex `param_groups` on torchtitan's names
    megatron/param_group_overrides.py  Megatron-core `config_overrides: {ParamKey: ParamGroupOverride}`,
                                       OptimizerConfig and OptimizerParamScheduler settings
    hf_trainer.py                      transformers.Trainer with `optimizers=(AdamW groups, schedule)`
    deepspeed_config.json + deepspeed_train.py   a client optimizer for `deepspeed.initialize`

Each file is loaded by its library (when installed) and the groups it yields are compared parameter
by parameter with optimizer.json before the call returns; a mismatch raises. A library that is not
installed leaves its file written and unchecked, with a note saying so.

What a framework cannot express is said in the file and in `notes`:
- torchtitan's linear warmup runs one step ahead of transformers' ((t+1)/w vs t/w); after warmup the
  cosine is the same float for float. Its `max_norm` always clips: no clipping is written as inf.
- Fused projections (torchtitan's wqkv, Megatron's linear_qkv and linear_fc1) hold several HF
  tensors in one; where those tensors' multipliers differ (attention scale 1/d folded into q_proj)
  torchtitan is given unfused q/k/v and Megatron cannot express it (said, not silently merged).
- `sp_warmup` (rule sp-warmup's multiplicative warmup) has no torchtitan or Megatron form.
Modules: param_names.py (shared rules), to_torchtitan.py, to_megatron.py, to_torch.py (HF Trainer, DeepSpeed).
Per-group ε is expressible everywhere here (torchtitan's per-group optimizer kwargs, Megatron's
override keys land in the torch param group, torch/DeepSpeed client optimizers).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from hptransfer.handoff.groups import OptimizerSpec
from hptransfer.handoff.param_names import hf_model_names, per_param
from hptransfer.handoff.to_megatron import write_megatron
from hptransfer.handoff.to_torch import write_deepspeed, write_hf_trainer
from hptransfer.handoff.to_torchtitan import write_torchtitan


class TrainerFiles(NamedTuple):
    files: dict[str, Path]
    notes: list[str]


def write_trainer_files(out_dir: Path, model_dir: Path, optimizer: dict) -> TrainerFiles:
    """Write DIR/trainers/* from optimizer.json's dict and the HF model folder, each checked with its
    trainer's own code where that library is installed. Returns the files and the caveats to print."""
    out_dir, model_dir = Path(out_dir), Path(model_dir)
    spec = OptimizerSpec.model_validate(optimizer)
    names, config = hf_model_names(model_dir)
    values = per_param(spec, names)
    files: dict[str, Path] = {}
    notes: list[str] = []
    files["torchtitan"], n = write_torchtitan(out_dir, spec, values, config)
    notes += n
    files["megatron"], n = write_megatron(out_dir, spec, values, config)
    notes += n
    files["hf_trainer"] = write_hf_trainer(out_dir, spec, values, model_dir)
    files.update(write_deepspeed(out_dir, spec, values, model_dir))
    return TrainerFiles(files, notes)


__all__ = ["TrainerFiles", "write_trainer_files"]
