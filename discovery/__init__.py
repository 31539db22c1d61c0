"""Which pods exist: EndpointSlices -> an immutable ``TargetSnapshot`` (a pure function), fed by a
Kubernetes list/watch source or an endpoints-file source. Reports through ``DiscoveryObserver``;
imports nothing from ``router``."""
