"""eyas.serve.interchange: draft checkpoints in and out of eyas.

formats.py     the EAGLE-3 / speculators config and tensor layouts engines load
engines.py     what vLLM, SGLang and TensorRT-LLM accept (refusals name the engine)
export.py      `eyas export`: eyas checkpoint -> engine layout, re-read and checked
importer.py    `eyas import`: published layouts (EAGLE-3, SpecForge, speculators, ModelOpt) -> eyas
publish.py     `eyas publish`: export + model card + Hugging Face hub upload
model_card.py  the model card (measured tau, recommendation table)
"""
