//! Prints the adapters wgpu sees and the capabilities of the one numr picks.
//! `NUMR_ADAPTER` (name substring or index) and `NUMR_BACKEND` (vulkan/metal/dx12/gl) choose it.

fn main() -> Result<(), numr::NumrError> {
    println!("adapters:");
    for a in numr::GpuContext::list_adapters() {
        println!("  {a}");
    }
    let ctx = numr::GpuContext::new()?;
    println!("\n{}", ctx.capabilities());
    Ok(())
}
