"""The route classifier's and the cascade's offline side: routing data, training, threshold calibration, RouteLLM
metrics and reports, cascade floors, and the `tokenomy router` commands that drive them."""
