// swift-tools-version:6.1
import PackageDescription

// One settings list for every Swift target (as swift-log does).
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "Stitch",
    // Linux needs no entry. On Apple platforms `Synchronization.Mutex` (and Observation) set the floor; those builds
    // are written for but never compiled on this project's machines (README, "Platforms and transports").
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11), .visionOS(.v2)],
    products: [
        .library(name: "Stitch", targets: ["Stitch"]),
        .executable(name: "stitch", targets: ["StitchCLI"]),
    ],
    traits: [
        .trait(
            name: "Libcurl",
            description: "The libcurl transport (needs libcurl's headers to build); without it downloads go over "
                + "URLSession (FoundationNetworking on Linux)."
        ),
        .default(enabledTraits: ["Libcurl"]),
    ],
    targets: [
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        .systemLibrary(
            name: "CCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        // libwslay ships no pkg-config file in Debian; the module map links it by name.
        .systemLibrary(
            name: "CWslay",
            providers: [.apt(["libwslay-dev"])]
        ),
        .systemLibrary(name: "CStitchSystem"),
        .target(name: "CStitchCRC"),
        // The one lock every target uses: a value behind a pthread mutex, which ThreadSanitizer sees (Locked.swift);
        // and the shared words read and written without one (AtomicWords.swift).
        .target(
            name: "StitchLocks",
            dependencies: ["CStitchSystem"],
            swiftSettings: swiftSettings
        ),
        // What the engine asks of a transport (the two-phase HTTPTransport protocol, its requests, responses and
        // errors), with nothing of any backend: the seam both backends and the engine build on.
        .target(
            name: "StitchTransport",
            dependencies: ["StitchLocks"],
            swiftSettings: swiftSettings
        ),
        // The libcurl backend (one multi handle on one event-loop thread). Empty without the Libcurl trait, so a
        // build without it needs no libcurl headers.
        .target(
            name: "StitchCurl",
            dependencies: [
                "StitchTransport", "StitchLocks", "CStitchSystem",
                .target(name: "CCurl", condition: .when(traits: ["Libcurl"])),
            ],
            swiftSettings: swiftSettings
        ),
        // The URLSession backend: data tasks with a delegate, asked for in windows (FoundationNetworking on Linux).
        .target(
            name: "StitchURLSession",
            dependencies: ["StitchTransport", "StitchLocks"],
            swiftSettings: swiftSettings
        ),
        // The engine, its storage, the manager and the background driver: the library without a backend. It runs
        // over any `HTTPTransport` it is given and knows nothing of either backend (the package graph keeps it so).
        .target(
            name: "StitchCore",
            dependencies: [
                "StitchTransport", "StitchLocks",
                // Apple platforms have CryptoKit and SQLite3 of their own (Support/DigestContext.swift and
                // Storage/Catalog/Catalog.swift choose by `canImport`); not built on this project's machines.
                .target(name: "CCrypto", condition: .when(platforms: [.linux])),
                .target(name: "CSQLite", condition: .when(platforms: [.linux])),
                "CStitchSystem", "CStitchCRC",
            ],
            swiftSettings: swiftSettings
        ),
        // The library users import: the core with the backends this build has, and the choice of one by default
        // (`Downloader()`, `DownloadManager(directory:)`); re-exports the core, the transport protocol and the backends.
        .target(
            name: "Stitch",
            dependencies: [
                "StitchCore", "StitchTransport", "StitchURLSession",
                .target(name: "StitchCurl", condition: .when(traits: ["Libcurl"])),
            ],
            swiftSettings: swiftSettings
        ),
        // aria2's JSON-RPC over a DownloadManager, without networking: what `stitch serve` hands request bodies to.
        .target(
            name: "StitchRPC",
            dependencies: ["Stitch", "StitchLocks"],
            swiftSettings: swiftSettings
        ),
        // `stitch serve`: the RPC over HTTP and WebSocket (libmicrohttpd + libwslay), the daemon's life.
        .target(
            name: "StitchServer",
            dependencies: ["Stitch", "StitchRPC", "StitchLocks", "CMicroHTTPD", "CWslay"],
            // The daemon's web page, built into the binary (PackageResources.index_html, …).
            resources: [.embedInCode("Web")],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "StitchCLI",
            dependencies: ["Stitch", "StitchServer", "StitchRPC", "StitchLocks", "CStitchSystem"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "stitch-example",
            dependencies: ["Stitch"],
            path: "Examples/SimpleDownload",
            swiftSettings: swiftSettings
        ),
        // A small program around DownloadManager that the manager's crash tests kill and restart.
        .executableTarget(
            name: "stitch-manager-harness",
            dependencies: ["Stitch"],
            path: "Tests/Harness/ManagerHarness",
            swiftSettings: swiftSettings
        ),
        // A fault-injecting HTTP server for bench/chaos.sh (SIGKILL + random faults soak).
        .executableTarget(
            name: "stitch-chaos-server",
            dependencies: ["StitchTestSupport", "StitchLocks"],
            path: "bench/ChaosServer",
            swiftSettings: swiftSettings
        ),
        // One download through BackgroundDownloads (download tasks), for bench/background.sh.
        .executableTarget(
            name: "stitch-background-bench",
            dependencies: ["Stitch"],
            path: "bench/BackgroundBench",
            swiftSettings: swiftSettings
        ),
        .target(
            name: "StitchTestSupport",
            dependencies: ["CStitchSystem", "Stitch", "StitchLocks"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "StitchTests",
            dependencies: [
                "Stitch", "StitchCore", "StitchTransport", "StitchURLSession", "StitchTestSupport", "StitchRPC",
                "StitchServer", "StitchLocks",
                .target(name: "StitchCurl", condition: .when(traits: ["Libcurl"])),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "StitchCLITests",
            dependencies: ["Stitch", "StitchCore", "StitchTestSupport", "StitchCLI", "StitchRPC", "StitchLocks"],
            swiftSettings: swiftSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
