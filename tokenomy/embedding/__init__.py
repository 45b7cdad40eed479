"""Sentence embeddings from the packaged all-MiniLM-L6-v2, as one ONNX graph run by onnxruntime."""
