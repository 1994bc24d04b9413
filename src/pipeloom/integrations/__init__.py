"""Other frameworks' runtimes, reached from pipeloom's side.

    torch  torch.distributed.pipelining: pipeloom plans in torch's runtime, torch's schedules in pipeloom
           (imports torch; import it by name)
    hf     Hugging Face transformers decoders cut into pipeline chunks (pipeline_chunks), their tied
           weights, and the model behind ``pipeloom run --model PATH`` (imports torch and transformers)
"""
