"""The TCP edge: name the client (``client_intake``: the PROXY header of ``proxy_protocol``, the
per-client slot), peek the hostname of a worker's gRPC connection (TLS SNI or h2c ``:authority``),
dial the named pod, splice the bytes (``edge`` -> ``tls_peek`` / ``h2c_peek`` -> ``routing`` ->
``dial`` -> ``relay``), or refuse in the client's protocol (``rejection``)."""
