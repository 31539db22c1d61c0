"""The TCP edge: name the client, peek the hostname of a worker's gRPC connection (TLS SNI or h2c
``:authority``), dial the named pod and splice, or refuse in the client's protocol (docs/architecture.md)."""
