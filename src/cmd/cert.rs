//! `sluice cert`: one certificate authority for a pool of workers, so a client trusts the
//! pool with one file (`ca.pem`) instead of every worker's self-signed certificate.

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Make a CA: OUT/ca.pem (what clients trust: --trust-cert, trust_cert=) and OUT/ca.key
    /// (owner-only; keep it where certificates are issued, not on the workers).
    Ca {
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a worker certificate signed by a CA: OUT/cert.pem and OUT/key.pem (owner-only),
    /// for `sluice cpu --cert OUT/cert.pem --key OUT/key.pem`.
    Issue {
        /// The CA's folder (ca.key).
        #[arg(long)]
        ca: PathBuf,
        /// The worker's name (the certificate's common name).
        #[arg(long)]
        name: String,
        /// Host names and IP addresses clients dial this worker by, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        san: Vec<String>,
        #[arg(long)]
        out: PathBuf,
    },
}

pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Ca { out } => {
            let cert = sluice_cpu::tls::make_ca(&out)?;
            println!(
                "CA {}: clients trust it (--trust-cert {0}); issue worker certificates with \
                 `sluice cert issue --ca {}`",
                cert.display(),
                out.display()
            );
        }
        Command::Issue { ca, name, san, out } => {
            let cert = sluice_cpu::tls::issue(&ca, &name, &san, &out)?;
            println!(
                "{}: serve it with `sluice cpu --cert {} --key {}`",
                cert.display(),
                cert.display(),
                out.join("key.pem").display()
            );
        }
    }
    Ok(())
}
