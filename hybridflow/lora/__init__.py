"""LoRA: low-rank adapters trained on the learner and delivered to the rollout engines.

- ``config``: ``learner.lora`` (rank, alpha, dropout, target modules); imports nothing heavy;
- ``names``: the adapter's tensors on the wire, in PEFT files and in vLLM; the table of
  adapter tensors a base model's linear layers give; the merge ``W + scale * B @ A``;
- ``peft_layers``: peft's LoRA layers injected into a Hugging Face model (learner and the
  ``hf`` engine), the adapter parameters under wire names, adapters switched off (the KL
  reference);
- ``export``: a PEFT adapter directory and a merged Hugging Face checkpoint.

Why adapters travel by themselves: a sync then moves ``2 * r * (in + out)`` numbers per
adapted layer instead of ``in * out`` (docs/lora.md has the measured bytes and seconds).
"""
