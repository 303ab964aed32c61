// `import Stitch` is all a user writes: the engine, the transport protocol and the backends this build has come with it, as
// swift-nio's `NIO` brings `NIOCore` and `NIOPosix`. They live in targets of their own so that the engine depends on
// the protocol alone and each backend on nothing of the engine (LayeringTests), and so that a build without the
// `Libcurl` trait has no libcurl code at all.
@_exported public import StitchCore
@_exported public import StitchTransport
@_exported public import StitchURLSession
#if Libcurl
@_exported public import StitchCurl
#endif
