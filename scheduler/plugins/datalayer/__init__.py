"""llm-d's data-layer plugins that describe what Ray EPP's actors do (pkg/epp/framework/plugins/
datalayer): the metrics scrape and its engine-metric mapping, which the metrics actors run with
these plugins' parameters (`data_layer_actor_options`), and the endpoint notifications that tell
the precise prefix producer which pods to follow, which the profile actors' KV-event feeds are."""
