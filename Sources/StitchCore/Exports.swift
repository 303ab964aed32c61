// The engine's API speaks the transport protocol's types (requests, validators, clocks): `import StitchEngine`
// brings them. It brings no backend: the engine runs over any `HTTPTransport` it is given.
@_exported public import StitchTransport
