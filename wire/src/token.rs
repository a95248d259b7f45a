//! The cluster token, read one way by every daemon, tool and client: a file's first line,
//! trimmed, or `$SLUICE_TOKEN`; an empty token is refused (a worker would refuse it with
//! less to go on).

use std::path::{Path, PathBuf};

/// Why no token could be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {}: the file's first line is empty (it holds the cluster token)", path.display())]
    EmptyFile { path: PathBuf },
    #[error("{from} is empty (it holds the cluster token)")]
    Empty { from: String },
}

/// The token in `path`: its first line, trimmed.
pub fn read(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(TokenError::EmptyFile {
            path: path.to_path_buf(),
        });
    }
    Ok(token.to_string())
}

/// A token given as text (`from` names where: `SLUICE_TOKEN`), trimmed.
pub fn from_text(text: &str, from: &str) -> Result<String, TokenError> {
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenError::Empty { from: from.into() });
    }
    Ok(token.to_string())
}

/// `file`'s token, else `$SLUICE_TOKEN`'s; `None` when neither is given.
pub fn from_file_or_env(file: Option<&Path>) -> Result<Option<String>, TokenError> {
    match (file, std::env::var("SLUICE_TOKEN")) {
        (Some(path), _) => read(path).map(Some),
        (None, Ok(text)) => from_text(&text, "SLUICE_TOKEN").map(Some),
        (None, Err(_)) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_the_first_line_trimmed_and_never_empty() {
        let dir = std::env::temp_dir().join(format!("sluice-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "  s3cret \nsecond line\n").unwrap();
        assert_eq!(read(&file).unwrap(), "s3cret");
        std::fs::write(&file, "\nsecond line\n").unwrap();
        let err = read(&file).unwrap_err().to_string();
        assert!(err.contains("first line is empty"), "{err}");
        let err = read(&dir.join("missing")).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        assert!(from_text(" \n", "SLUICE_TOKEN").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
