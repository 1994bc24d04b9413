"""Other frameworks' runtimes, reached from pipeloom's side.

    torch  torch.distributed.pipelining: pipeloom plans in torch's runtime, torch's schedules in pipeloom
           (imports torch; import it by name)
    hf     Hugging Face transformers decoders cut into pipeline chunks (pipeline_chunks), their tied
           weights, and the model behind ``pipeloom run --model PATH`` (imports torch and transformers)
    hf_tp  tensor-parallel shards of those chunks (Llama-shaped families) for ``run --model PATH --tp N``
    hf_meta  the model built on ``meta``, its seeded initialization replayed one module at a time so that a
           TP rank materializes only its shards
    torchtitan  a plan as what torchtitan 0.3 loads through its own config machinery: a config module and
           command-line overrides (placement, layer split, schedule CSV, version check; no torch)
    megatron    a plan as Megatron-LM arguments that Megatron's own checks accept (no torch)
"""
