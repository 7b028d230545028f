//! Reading the agent's configuration file: the commands' job, so the renderings stay pure
//! (`hcp_fleet_render::config` parses and validates text; it opens no file).

use std::path::Path;

use hcp_fleet_render::config::{AgentConfig, ConfigError};

/// The file at `path`, parsed and validated; every problem is reported at once.
pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: p.clone(),
        source,
    })?;
    AgentConfig::from_yaml(&p, &text)
}

/// The file if one is given, else the built-in defaults (commands that read the agent's
/// configuration only for its names).
pub fn load_or_default(path: Option<&Path>) -> Result<AgentConfig, ConfigError> {
    path.map_or_else(|| Ok(AgentConfig::default()), load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_a_read_error_naming_it_and_none_means_the_defaults() {
        let missing = Path::new("/nonexistent/hcp-fleet-agent.yaml");
        let e = load(missing).expect_err("no such file");
        assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
        assert!(
            e.to_string().contains("/nonexistent/hcp-fleet-agent.yaml"),
            "{e}"
        );
        assert_eq!(
            load_or_default(None).expect("defaults"),
            AgentConfig::default()
        );
    }

    #[test]
    fn a_file_is_parsed_and_validated_with_its_path_in_every_problem() {
        let path = std::env::temp_dir().join(format!(
            "hcp-fleet-config-file-test-{}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, "concurrency: 0\n").expect("write");
        let e = load(&path).expect_err("concurrency 0 is refused");
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("concurrency must be at least 1"), "{text}");
        std::fs::write(&path, "concurrency: 4\n").expect("write");
        let read = load_or_default(Some(&path));
        let _ = std::fs::remove_file(&path);
        assert_eq!(read.expect("valid").concurrency, 4);
    }
}
