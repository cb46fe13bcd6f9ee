"""The large run: Ray Train workers each driving a DeepSpeed engine built from the plan."""
