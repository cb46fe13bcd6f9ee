"""Differentially private fine-tuning (docs/RESEARCH.md, paper 1: Rehn et al., arXiv 2510.20616).

One concept per file, in pipeline order:
`config` (the spec's `dp:` block) → `accounting` (σ(B) from Opacus' accountants, the σ√T table) →
`rule` (pure: choose B, the clipping grid, the LR scaling) → `plan` (`dp_plan_for(config) -> DPPlan`)
→ `train` (Opacus DP-Adam in the normalized clipping form) → `lm` (the private sequences of a
corpus, Opacus for µP) → `lm_task` (one DP fine-tuning trial of the spec's language model) and `task`
(an offline digits transfer-learning task) → `sweep` (`hpt dp-sweep` over either task) → `cli`
(`hpt dp-plan`). Nothing heavy is imported here.
"""
