"""Models: what pipeloom knows of a model, and the small torch models it runs.

    config   ModelConfig: THE description of a decoder-only transformer (no torch), read by the
             memory model, the partitioner's layer costs and the torch Llama
    presets  published shapes (Llama 2/3, GPT-3, llama-tiny) as ModelConfig (no torch)
    registry the model-architecture registry: one Family per Hugging Face model_type (config reader,
             transformers defaults, optional layer params/FLOPs, torch chunk hooks; no torch)
    families one module per model_type, each registering its Family (llama, mistral, qwen2, qwen3, gpt2,
             mixtral, qwen3_moe, qwen2_moe, deepseek_v3, deepseek_v2, gemma, gemma2, phi3); a new
             architecture is one module there + one import line
    hf_config  a Hugging Face config.json as ModelConfig (read as JSON by its family's reader, no torch) and
             resolve_model, the one --model resolution; published configs shipped in hf_configs/
    flops    parameters of a layer / embedding / head and per-layer F/B/W FLOPs, dense and MoE (no torch)
    moe      expert / context parallel layouts (ep carved out of dp * cp, group sizes), routed-expert
             parameters per rank, the capacity factor or dropless imbalance (no torch)
    slicing  cut a model's layers into the schedule's chunks (even_layer_split: no torch;
             chunk_modules: torch)
    llama    the built-in tiny Llama used by the demo, the tests and the benchmarks (torch)
    tp       its tensor-parallel shards: column/row-parallel linears, vocab-parallel embedding and cross
             entropy, sequence parallelism (torch); tp_comm the TP collectives, the column-parallel groups'
             autograd function with its overlap and the emulated link (torch); tp_grads the shards' gradient
             and gather helpers (torch); tp_modes the overlap modes' names (no torch)

Importing this package imports nothing heavy; the modules are imported by name.
"""
