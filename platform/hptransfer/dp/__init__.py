"""Differentially private fine-tuning (docs/RESEARCH.md, paper 1: Rehn et al., arXiv 2510.20616).

One concept per file, in pipeline order:
`config` (the spec's `dp:` block) → `accounting` (σ(B) from Opacus' accountants, the σ√T table) →
`rule` (pure: choose B, the clipping grid, the LR scaling) → `plan` (`dp_plan_for(config) -> DPPlan`)
→ `train` (Opacus DP-Adam in the normalized clipping form) → `task` (an offline transfer-learning
task) → `cli` (`hpt dp-plan`). Nothing heavy is imported here.
"""
