"""eyas.serve.interchange: draft checkpoints in and out of eyas.

formats.py     the tensor layouts engines load (their config.json: train/kinds/config_json.py)
engines.py     what vLLM, SGLang and TensorRT-LLM accept (refusals name the engine)
export.py      `eyas export`: eyas checkpoint -> engine layout, re-read and checked
importer.py    `eyas import`: published layouts (EAGLE-3, SpecForge, speculators, ModelOpt) -> eyas
(`eyas publish` and its model card sit above eval, whose report they read: eyas/publish.py and
eyas/model_card.py)
"""
