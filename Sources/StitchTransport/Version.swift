/// Stitch's version, as reported by `stitch --version` and in the User-Agent.
public enum StitchVersion {
    public static let string = "0.1.0"
}
