//! `sluice synth`: a synthetic ImageFolder dataset of real JPEG files (see
//! `sluice_dataset::synth`). The same seed gives the same files.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// Output folder (one subfolder per class).
    #[arg(long)]
    output: PathBuf,
    /// Number of classes.
    #[arg(long, default_value_t = 10)]
    classes: u32,
    /// Images per class.
    #[arg(long, default_value_t = 20)]
    per_class: u32,
    /// Seed of the generated content.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// JPEG quality (1-100).
    #[arg(long, default_value_t = 90)]
    quality: u8,
}

pub fn run(args: Args) -> Result<()> {
    let started = std::time::Instant::now();
    let n = sluice_dataset::synth::generate(
        &args.output,
        args.classes,
        args.per_class,
        args.seed,
        args.quality,
    )?;
    println!(
        "wrote {n} JPEGs in {} classes to {} in {:.1}s",
        args.classes,
        args.output.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
