//! Byte sizes with units: `512`, `4K`, `1GiB`, `10GB`.

/// Parses a size: an integer, optionally followed (spaces allowed) by a unit.
/// `K`/`M`/`G`/`T` and `KiB`/`MiB`/`GiB`/`TiB` are binary (1024-based), `KB`/`MB`/`GB`/`TB`
/// decimal, `B` is bytes. Units are case-sensitive so that `Mb` is not taken for `MB`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number = number.replace('_', "");
    if number.is_empty() {
        return Err(SizeError::NoNumber(text.to_owned()));
    }
    let multiplier: u64 = match unit.trim_start() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(SizeError::UnknownUnit {
                text: text.to_owned(),
                unit: other.to_owned(),
            })
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| SizeError::TooLarge(text.to_owned()))
}

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size {0:?}: expected a number of bytes, e.g. 1GiB")]
    NoNumber(String),
    #[error(
        "invalid size {text:?}: unknown unit {unit:?} (use K/M/G/T, KiB/MiB/GiB/TiB or KB/MB/GB/TB)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("invalid size {0:?}: too large")]
    TooLarge(String),
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn units() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size("3MB"), Ok(3_000_000));
        assert_eq!(parse_size("1_048_576"), Ok(1 << 20));
    }

    #[test]
    fn rejects() {
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("1.5G")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_size("1Gb")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .to_string()
            .contains("too large"));
    }
}
